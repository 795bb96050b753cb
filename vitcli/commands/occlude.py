"""`vitcli occlude-quadrants` and `occlude-patches`: the Typer commands and their options; their Jobs and builders
are vitcli.jobs.occlude."""

from __future__ import annotations

from typing import Annotated

import typer

from vitcli.commands.target_options import (
    ContrastTextOption,
    TargetDirectionOption,
    TargetFeatureOption,
    TargetImageOption,
    TargetOption,
    TargetTextOption,
)
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
    examples=[
        "vitcli occlude-quadrants examples/images/newfoundland_31.jpg",
        "vitcli occlude-quadrants examples/images --target Newfoundland --fill black --format csv",
    ],
)
def occlude_quadrants_command(
    context: CommandContext,
    images: ImagesArgument = None,
    target: TargetOption = None,
    fill: FillOption = Fill.gray,
    target_image: TargetImageOption = None,
    target_direction: TargetDirectionOption = None,
    target_feature: TargetFeatureOption = None,
    target_text: TargetTextOption = None,
    contrast_text: ContrastTextOption = None,
) -> None:
    """Cover each quadrant in turn (112x112 on a 224 input): how far does the target probability fall?"""
    jobs = occlude_quadrants_jobs(
        target, fill, target_image, target_direction, target_feature, target_text, contrast_text
    )
    context.run(jobs, images)


@vitcli_command(
    "occlude-patches",
    examples=[
        "vitcli occlude-patches examples/images/newfoundland_31.jpg",
        "vitcli occlude-patches examples/images/newfoundland_31.jpg --size 32 --stride 16 --fill blur",
    ],
)
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
    target_image: TargetImageOption = None,
    target_direction: TargetDirectionOption = None,
    target_feature: TargetFeatureOption = None,
    target_text: TargetTextOption = None,
    contrast_text: ContrastTextOption = None,
) -> None:
    """Slide a cover over the input (one per patch by default) and map the drop in target probability."""
    jobs = occlude_patches_jobs(
        target, fill, size, stride, target_image, target_direction, target_feature, target_text, contrast_text
    )
    context.run(jobs, images)
