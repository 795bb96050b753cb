"""`vitcli patch`: the Typer command; its options, Jobs and builder are vitcli.jobs.patch."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from vitcli.context import CommandContext
from vitcli.jobs.patch import clean_and_corrupt, patch_jobs, patch_pair_job
from vitcli.shell import vitcli_command

PairArgument = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="CLEAN CORRUPT",
        help="Two image files: CLEAN (whose activations are put back), then CORRUPT (the run that is patched).",
        show_default=False,
    ),
]


@vitcli_command(
    "patch",
    builder=patch_jobs,
    examples=[
        "vitcli patch examples/images/newfoundland_31.jpg examples/images/Persian_98.jpg",
        "vitcli patch examples/images/newfoundland_31.jpg examples/images/Persian_98.jpg --sites heads "
        "--method activation --method attribution",
        "vitcli patch dog.jpg cat.jpg --target 256 --contrast 283 --sites attention --sites mlp --format json",
    ],
)
def patch_command(context: CommandContext, images: PairArgument = None, **options: Any) -> None:
    """Activation patching: run CORRUPT, put back CLEAN's activation at one site (residual row, attention or MLP
    output, head), and score how much of M = logit(target) - logit(contrast) it restores."""
    from vitcli.runner import LineSteps, ProgressSteps, Report, progress_display

    pair_job = patch_pair_job(images, **options)
    clean_path, corrupt_path = clean_and_corrupt(images)
    (job,) = context.plan([pair_job])
    model = context.model()
    with progress_display(context.show_progress(1)) as progress:
        steps = ProgressSteps(progress) if progress is not None else LineSteps(context.messages.info)
        # One result about the pair: a failure ends the command with its own message.
        context.session(model, reraise=True).run([job], [clean_path, corrupt_path], Report(), progress, steps)
    context.emitter.finish()
