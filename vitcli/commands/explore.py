"""`vitcli explore`: the Typer command and its options; its Jobs and their builder are vitcli.jobs.explore."""

from __future__ import annotations

from typing import Annotated

import typer

from vitcli.context import CommandContext
from vitcli.jobs.explore import explore_jobs
from vitcli.options import ImagesArgument
from vitcli.shell import vitcli_command


@vitcli_command(
    "explore",
    examples=[
        "vitcli explore examples/images/newfoundland_31.jpg",
        "vitcli explore photo.jpg --model vit_base_patch16_224 --blocks 1-4",
    ],
)
def explore_command(
    context: CommandContext,
    images: ImagesArgument = None,
    blocks: Annotated[
        str | None,
        typer.Option(
            help="Blocks on the page: 4, 1-4, 1,6,12 or all (default: all, when they fit the page's bound of "
            "2,000,000 attention values).",
            show_default=False,
        ),
    ] = None,
    explain: Annotated[
        bool,
        typer.Option(
            "--explain",
            help="Also compute `vitcli explain`'s default maps (top-1 class) and offer them in the main panel.",
        ),
    ] = False,
) -> None:
    """Interactive attention explorer: one self-contained HTML page per image with every block's and head's exact
    attention (float16); click a patch to see where it looks, in every head, with rollout."""
    context.run(explore_jobs(blocks, explain), images)
