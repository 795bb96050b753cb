from __future__ import annotations

from typing import Annotated, Optional

import typer

from vitcli.shell import CommandContext, ImagesArgument, vitcli_command


@vitcli_command("patches")
def patches_command(
    context: CommandContext,
    images: ImagesArgument = None,
    patch: Annotated[
        Optional[list[str]],
        typer.Option("--patch", "-p", help="Show this patch in full: 63, P63 or r4c6 (zero-based); repeatable."),
    ] = None,
    values: Annotated[int, typer.Option("--values", min=1, help="Leading values shown per vector and CSV projection columns.")] = 8,
) -> None:
    """The patch grid, channel-major flattening and the patch projection, checked against the model's Conv2d."""
    from vitcli.output import run_document, write_csv, write_figure, write_json
    from vitcli.patches import inspect_patches, patch_figure

    paths = context.images(images)
    model = context.model()
    selected = [model.grid.parse_patch(text) for text in patch or []]
    provenance = context.provenance(model)
    results = []
    for path, folder in zip(paths, context.image_directories(paths)):
        image = model.prepare(path)
        result = inspect_patches(model, image, selected, values)
        context.output.wrote(
            [
                write_csv(folder / "patches.csv", result.rows()),
                write_json(folder / "patches.json", run_document([result], provenance)),
                write_figure(folder / "patches.png", patch_figure(result, image.crop_uint8())),
            ]
        )
        results.append(result)
    context.output.emit(results, provenance)
