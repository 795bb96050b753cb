"""`vitcli ablate`: the Typer command and its options; its Jobs and their builder are vitcli.jobs.ablate."""

from __future__ import annotations

from pathlib import Path
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
from vitcli.jobs.ablate import Mode, ablate_jobs
from vitcli.options import ImagesArgument
from vitcli.shell import vitcli_command


@vitcli_command(
    "ablate",
    examples=[
        "vitcli ablate examples/images/newfoundland_31.jpg",
        "vitcli ablate photos/ --heads 10.1,11.3 --blocks 11.attn,11.mlp --mode mean",
        "vitcli ablate photo.jpg --mode resample --reference other_photos/",
    ],
)
def ablate_command(
    context: CommandContext,
    images: ImagesArgument = None,
    target: TargetOption = None,
    heads: Annotated[
        str | None,
        typer.Option(
            help="Heads to ablate one at a time: all, or BLOCK.HEAD items from one (4.2,11.3). Default: all, "
            "unless only --blocks is given.",
            show_default=False,
        ),
    ] = None,
    blocks: Annotated[
        str | None,
        typer.Option(
            help="Whole sublayers to ablate one at a time: all, or BLOCK.attn / BLOCK.mlp items (4.attn,4.mlp).",
            show_default=False,
        ),
    ] = None,
    mode: Annotated[
        Mode,
        typer.Option(
            help="zero: the output becomes 0; mean: its mean over the reference images, token by token; resample: "
            "its value on one reference image (the first, by path, that is not the image itself)."
        ),
    ] = Mode.zero,
    reference: Annotated[
        Path | None,
        typer.Option(
            help="Images (a folder, file or glob) for --mode mean and resample. Default: this run's images.",
            show_default=False,
        ),
    ] = None,
    target_image: TargetImageOption = None,
    target_direction: TargetDirectionOption = None,
    target_feature: TargetFeatureOption = None,
    target_text: TargetTextOption = None,
    contrast_text: ContrastTextOption = None,
) -> None:
    """Ablate heads (or whole attention and MLP sublayers) one at a time, all ablations of an image as batched
    forwards: the change of the target logit and probability and whether the top-1 changes."""
    jobs = ablate_jobs(
        target,
        heads,
        blocks,
        mode,
        reference,
        run_images=images or [],
        target_image=target_image,
        target_direction=target_direction,
        target_feature=target_feature,
        target_text=target_text,
        contrast_text=contrast_text,
    )
    context.run(jobs, images)
