from __future__ import annotations

from enum import Enum
from functools import partial
from typing import Annotated

import typer

from vitcli.shell import CommandContext, ImagesArgument, vitcli_command

TargetOption = Annotated[
    str | None,
    typer.Option(
        "--target", "-t", help="Class to follow: an index (256) or a label (Newfoundland). Default: the clean top-1.",
        show_default=False,
    ),
]


class Fill(str, Enum):
    gray = "gray"
    black = "black"
    white = "white"
    mean = "mean"
    blur = "blur"


FillOption = Annotated[
    Fill,
    typer.Option(
        help="What covered pixels become: gray = the checkpoint's mean (normalized 0), black, white, "
        "mean = this image's mean colour, blur = a Gaussian-blurred copy (sigma half a patch)."
    ),
]


@vitcli_command("occlude-quadrants")
def occlude_quadrants_command(
    context: CommandContext, images: ImagesArgument = None, target: TargetOption = None, fill: FillOption = Fill.gray
) -> None:
    """Cover each 112x112 quadrant in turn: how far does the target probability fall?"""
    from vitcli.occlusion import occlude_quadrants, quadrant_figure
    from vitcli.output import run_document, write_csv, write_figure, write_json

    paths = context.images(images)
    model = context.model()
    provenance = context.provenance(model)
    results = []
    for path, folder in zip(paths, context.image_directories(paths)):
        prepared = model.prepare(path)
        result = occlude_quadrants(model, prepared, target, fill.value)
        context.output.wrote(
            [
                write_csv(folder / "quadrant_drops.csv", result.rows()),
                write_json(folder / "quadrant_drops.json", run_document([result], provenance)),
                write_figure(folder / "quadrants.png", quadrant_figure(model, prepared, result)),
            ]
        )
        results.append(result)
    context.output.emit(results, provenance)


@vitcli_command("occlude-patches")
def occlude_patches_command(
    context: CommandContext,
    images: ImagesArgument = None,
    target: TargetOption = None,
    fill: FillOption = Fill.gray,
    size: Annotated[
        int | None, typer.Option(help="Cover side in pixels (default: the patch size).", show_default=False)
    ] = None,
    stride: Annotated[
        int | None, typer.Option(help="Step between covers in pixels (default: the cover size).", show_default=False)
    ] = None,
) -> None:
    """Slide a cover over the input (one per 16x16 patch by default) and map the drop in target probability."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from vitcli.occlusion import SlidingWindows, occlude_patches, patch_figure
    from vitcli.output import run_document, write_csv, write_figure, write_json, write_text

    paths = context.images(images)
    model = context.model()
    window_size = size if size is not None else model.grid.patch_size
    windows = SlidingWindows(model.grid, window_size, stride if stride is not None else window_size)
    provenance = context.provenance(model)
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
        console=Console(stderr=True), disable=context.output.options.quiet, transient=True, redirect_stdout=False,
    )
    results = []
    with progress:
        for path, folder in zip(paths, context.image_directories(paths)):
            prepared = model.prepare(path)
            task = progress.add_task(f"occluding {path.name}", total=len(windows))
            result = occlude_patches(
                model, prepared, windows, target, fill.value, on_batch=partial(progress.advance, task)
            )
            progress.remove_task(task)
            grid_text = "\n".join(",".join(repr(value) for value in row) for row in result.drop_grid.tolist()) + "\n"
            context.output.wrote(
                [
                    write_csv(folder / "patch_drops.csv", result.rows()),
                    write_text(folder / "drop_grid.csv", grid_text),
                    write_json(folder / "patch_drops.json", run_document([result], provenance)),
                    write_figure(folder / "patch_drops.png", patch_figure(model, prepared, result)),
                ]
            )
            if result.uncovered_pixels:
                context.output.warn(
                    f"{result.uncovered_pixels} pixels of {path.name} are under no cover (size {windows.size}, "
                    f"stride {windows.stride}): their drop is NaN (empty in JSON)"
                )
            results.append(result)
    context.output.emit(results, provenance)
