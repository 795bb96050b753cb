from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vitcli.shell import CommandContext, vitcli_command


@vitcli_command("compare-patch-size")
def compare_patch_size_command(
    context: CommandContext,
    patch_sizes: Annotated[
        str, typer.Option("--patch-sizes", "-p", help="Comma-separated patch sizes in pixels; the checkpoint's own is always added.")
    ] = "8,16,32",
    image_size: Annotated[
        int | None, typer.Option("--image-size", help="Image side in pixels (default: the checkpoint's, 224).", show_default=False)
    ] = None,
    pad: Annotated[
        bool, typer.Option("--pad", help="Allow patch sizes that do not divide the image: zero-pad right and bottom as timm's dynamic_img_pad.")
    ] = False,
    measure: Annotated[
        bool, typer.Option("--measure", help="Also time each variant (random init) on --device and measure its peak memory.")
    ] = False,
    runs: Annotated[int, typer.Option("--runs", min=1, help="Timed forwards per variant with --measure (the median is shown).")] = 10,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Untimed forwards before timing with --measure.")] = 2,
    adapt: Annotated[
        str | None,
        typer.Option("--adapt", metavar="IMAGE", help="Resample the checkpoint to each patch size and run IMAGE (adapted, not retrained).", show_default=False),
    ] = None,
) -> None:
    """Tokens, attention scores and compute per patch size (no image or weights needed); --measure, --adapt IMAGE."""
    from vitcli.errors import UsageError
    from vitcli.loading import default_batch_size, resolve_device
    from vitcli.output import run_document, write_csv, write_figure, write_json
    from vitcli.patch_size import (
        MeasureSettings,
        architecture_provenance,
        chart,
        compare_patch_sizes,
        parse_patch_sizes,
        plan_variants,
        read_architecture,
    )

    architecture = read_architecture(context.weights.model_name)
    requested = parse_patch_sizes(patch_sizes)
    variants = plan_variants(architecture, requested, architecture.native_image if image_size is None else image_size, pad)
    if architecture.native_patch not in requested:
        context.output.message(f"added the checkpoint's own patch size {architecture.native_patch}: every ratio is taken against it")
    settings = None
    if measure:
        device = resolve_device(context.device)
        batch_size = context.batch_size or default_batch_size(device)
        settings = MeasureSettings(device, batch_size, runs, warmup, context.weights.seed)
    adapted = None
    if adapt is None and (context.weights.random or context.weights.checkpoint is not None):
        context.output.message("the counts need no weights: --weights and --checkpoint are used only with --adapt")
    if adapt is not None:
        paths = context.images([adapt])
        if len(paths) != 1:
            raise UsageError(f"--adapt takes one image, not {len(paths)} ({adapt})")
        adapted = (context.model(), paths[0])
    comparison = compare_patch_sizes(variants, settings, adapted, context.output.message)
    if adapted is not None:
        provenance = context.provenance(adapted[0])
    else:
        provenance = {**architecture_provenance(architecture), "command": context.command_line}
    provenance["comparison"] = comparison.note
    folder = context.output.directory(Path("outputs", "compare-patch-size"))
    context.output.wrote(
        [
            write_csv(folder / "patch_sizes.csv", comparison.rows()),
            write_json(folder / "patch_sizes.json", run_document([comparison], provenance)),
            write_figure(folder / "patch_sizes.png", chart(comparison)),
        ]
    )
    context.output.emit([comparison], provenance)
