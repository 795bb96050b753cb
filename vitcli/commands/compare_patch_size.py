"""`vitcli compare-patch-size`: the Typer command and its options; its Jobs and their builder are
vitcli.jobs.compare_patch_size."""

from __future__ import annotations

from typing import Annotated

import typer

from vitcli.context import CommandContext
from vitcli.errors import UsageError
from vitcli.jobs.compare_patch_size import MAX_IMAGE_SIZE, MAX_RUNS, PatchSizeJob, compare_patch_size_jobs
from vitcli.naming import MODEL_SUBJECT
from vitcli.shell import vitcli_command


@vitcli_command(
    "compare-patch-size",
    examples=[
        "vitcli compare-patch-size",
        "vitcli compare-patch-size --patch-sizes 8,14,32 --pad --measure --device cpu",
        "vitcli compare-patch-size --adapt examples/images/newfoundland_31.jpg",
    ],
)
def compare_patch_size_command(
    context: CommandContext,
    patch_sizes: Annotated[
        str,
        typer.Option(
            "--patch-sizes", "-p", help="Comma-separated patch sizes in pixels; the checkpoint's own is always added."
        ),
    ] = "8,16,32",
    image_size: Annotated[
        int | None,
        typer.Option(
            "--image-size",
            min=1,
            max=MAX_IMAGE_SIZE,
            help="Image side in pixels (default: the checkpoint's, 224).",
            show_default=False,
        ),
    ] = None,
    pad: Annotated[
        bool,
        typer.Option(
            "--pad",
            help="Allow patch sizes that do not divide the image: zero-pad right and bottom as timm's dynamic_img_pad.",
        ),
    ] = False,
    measure: Annotated[
        bool,
        typer.Option("--measure", help="Also time each variant (random init) on --device and measure its peak memory."),
    ] = False,
    runs: Annotated[
        int,
        typer.Option(
            "--runs", min=1, max=MAX_RUNS, help="Timed forwards per variant with --measure (the median is shown)."
        ),
    ] = 10,
    warmup: Annotated[
        int, typer.Option("--warmup", min=0, max=MAX_RUNS, help="Untimed forwards before timing with --measure.")
    ] = 2,
    adapt: Annotated[
        str | None,
        typer.Option(
            "--adapt",
            metavar="IMAGE",
            help="Resample the checkpoint to each patch size and run IMAGE (adapted, not retrained).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Tokens, attention scores and compute per patch size (no image or weights needed); --measure, --adapt IMAGE."""
    jobs = context.plan(compare_patch_size_jobs(patch_sizes, image_size, pad, measure, runs, warmup, adapt))
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
    _count_without_weights(context, job)


def _count_without_weights(context: CommandContext, job: PatchSizeJob) -> None:
    """The comparison about the model alone, computed without loading weights and published under `model`."""
    from vitcli.experiments.patch_size import ARCHITECTURE_ONLY, compare_patch_sizes
    from vitcli.loading import default_batch_size, resolve_device
    from vitcli.presentation.patch_size import dimensions_provenance

    device = resolve_device(context.device)
    settings = job.measure_settings(device, context.batch_size or default_batch_size(device), context.spec.seed)
    result = compare_patch_sizes(job.variants, settings, progress=context.messages.info)
    provenance = {
        **dimensions_provenance(job.dimensions),
        "weights_label": ARCHITECTURE_ONLY,
        "command": context.command_line,
        "comparison": result.note,
    }
    context.publish([(job, result, MODEL_SUBJECT, None)], provenance)
