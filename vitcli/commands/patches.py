"""`vitcli patches`: the Typer command; its options, Jobs and builder are vitcli.jobs.patches."""

from __future__ import annotations

from typing import Any

from vitcli.context import CommandContext
from vitcli.jobs.patches import patches_jobs
from vitcli.options import ImagesArgument
from vitcli.shell import vitcli_command


@vitcli_command(
    "patches",
    builder=patches_jobs,
    examples=[
        "vitcli patches examples/images/newfoundland_31.jpg --patch 63",
        "vitcli patches examples/images/Persian_98.jpg --patch r4c6 --patch 74 --values 4",
    ],
)
def patches_command(context: CommandContext, images: ImagesArgument = None, **options: Any) -> None:
    """The patch grid, channel-major flattening and the patch projection, checked against the model's Conv2d."""
    context.run(patches_jobs(**options), images)
