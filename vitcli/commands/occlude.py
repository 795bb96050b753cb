"""`vitcli occlude-quadrants` and `occlude-patches`: the Typer commands; their options, Jobs and builders are
vitcli.jobs.occlude."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from vitcli.context import CommandContext
from vitcli.jobs.occlude import Fill, occlude_patches_jobs, occlude_quadrants_jobs
from vitcli.options import ImagesArgument
from vitcli.shell import vitcli_command

FillOption = Annotated[
    Fill,
    typer.Option(
        help="What covered pixels become: gray = the checkpoint's mean (normalized 0), black, white, "
        "mean = this image's mean colour, blur = a Gaussian-blurred copy (sigma half a patch)."
    ),
]


@vitcli_command(
    "occlude-quadrants",
    builder=occlude_quadrants_jobs,
    examples=[
        "vitcli occlude-quadrants examples/images/newfoundland_31.jpg",
        "vitcli occlude-quadrants examples/images --target Newfoundland --fill black --format csv",
    ],
)
def occlude_quadrants_command(context: CommandContext, images: ImagesArgument = None, **options: Any) -> None:
    """Cover each quadrant in turn (112x112 on a 224 input): how far does the target probability fall?"""
    context.run(occlude_quadrants_jobs(**options), images)


@vitcli_command(
    "occlude-patches",
    builder=occlude_patches_jobs,
    examples=[
        "vitcli occlude-patches examples/images/newfoundland_31.jpg",
        "vitcli occlude-patches examples/images/newfoundland_31.jpg --size 32 --stride 16 --fill blur",
    ],
)
def occlude_patches_command(context: CommandContext, images: ImagesArgument = None, **options: Any) -> None:
    """Slide a cover over the input (one per patch by default) and map the drop in target probability."""
    context.run(occlude_patches_jobs(**options), images)
