"""`vitcli explore`: the Typer command; its options, Jobs and builder are vitcli.jobs.explore."""

from __future__ import annotations

from typing import Any

from vitcli.context import CommandContext
from vitcli.jobs.explore import explore_jobs
from vitcli.options import ImagesArgument
from vitcli.shell import vitcli_command


@vitcli_command(
    "explore",
    builder=explore_jobs,
    examples=[
        "vitcli explore examples/images/newfoundland_31.jpg",
        "vitcli explore photo.jpg --model vit_base_patch16_224 --blocks 1-4",
    ],
)
def explore_command(context: CommandContext, images: ImagesArgument = None, **options: Any) -> None:
    """Interactive attention explorer: one self-contained HTML page per image with every block's and head's exact
    attention (float16); click a patch to see where it looks, in every head, with rollout."""
    context.run(explore_jobs(**options), images)
