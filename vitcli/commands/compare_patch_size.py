"""`vitcli compare-patch-size`: the Typer command; its options, Jobs and builder are vitcli.jobs.compare_patch_size."""

from __future__ import annotations

from typing import Any

from vitcli.context import CommandContext
from vitcli.errors import UsageError
from vitcli.jobs.compare_patch_size import compare_patch_size_jobs
from vitcli.shell import vitcli_command


@vitcli_command(
    "compare-patch-size",
    builder=compare_patch_size_jobs,
    examples=[
        "vitcli compare-patch-size",
        "vitcli compare-patch-size --patch-sizes 8,14,32 --pad --measure --device cpu",
        "vitcli compare-patch-size --adapt examples/images/newfoundland_31.jpg",
    ],
)
def compare_patch_size_command(context: CommandContext, **options: Any) -> None:
    """Tokens, attention scores and compute per patch size (no image or weights needed); --measure, --adapt IMAGE."""
    from vitcli.runner import Report

    jobs = context.plan(compare_patch_size_jobs(**options))
    adapt = options["adapt"]
    (job,) = jobs
    if job.added_native:
        context.messages.info(
            f"added the checkpoint's own patch size {job.dimensions.native_patch}: every ratio is taken against it"
        )
    if adapt is not None:
        paths = context.images([adapt])
        if len(paths) != 1:
            raise UsageError(f"--adapt takes one image, not {len(paths)} ({adapt})")
        context.run(jobs, [str(paths[0])])
        return
    if context.spec.random or context.spec.checkpoint is not None:
        context.messages.info("the counts need no weights: --weights and --checkpoint are used only with --adapt")
    job.progress = context.messages.info
    # One result about the architecture, computed without weights: a failure ends the command with its own message.
    context.session(context.unloaded_model(), reraise=True).run(jobs, [], Report())
    context.emitter.finish()
