"""`vitcli attribute`: the Typer command and its options; its Jobs and their builder are vitcli.jobs.attribute."""

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
from vitcli.jobs.attribute import By, attribute_jobs
from vitcli.options import ImagesArgument
from vitcli.shell import vitcli_command

ContrastOption = Annotated[
    str | None,
    typer.Option(
        "--contrast",
        help="A second class: attribute the logit difference target - contrast (an index or a label).",
        show_default=False,
    ),
]


@vitcli_command(
    "attribute",
    examples=[
        "vitcli attribute examples/images/newfoundland_31.jpg",
        "vitcli attribute photo.jpg --by head --target Newfoundland --contrast Persian",
        "vitcli attribute photo.jpg --by token --block 11",
    ],
)
def attribute_command(
    context: CommandContext,
    images: ImagesArgument = None,
    target: TargetOption = None,
    contrast: ContrastOption = None,
    by: Annotated[
        By,
        typer.Option(
            help="block: the embedding and each block's attention and MLP; head: every head (and each block's "
            "attention bias); token: each source token through each head of --block."
        ),
    ] = By.block,
    block: Annotated[
        int | None,
        typer.Option(help="The block (from 1) of --by token.", show_default=False),
    ] = None,
    target_image: TargetImageOption = None,
    target_direction: TargetDirectionOption = None,
    target_feature: TargetFeatureOption = None,
    target_text: TargetTextOption = None,
    contrast_text: ContrastTextOption = None,
) -> None:
    """Direct logit attribution: the target logit split exactly into what the embedding, each block's attention
    and MLP, each head or each source token wrote, with the final LayerNorm's scale frozen; checked to add up."""
    jobs = attribute_jobs(
        target, contrast, by, block, target_image, target_direction, target_feature, target_text, contrast_text
    )
    context.run(jobs, images)
