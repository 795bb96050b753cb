"""`vitcli trace`: the Typer command; its options, Jobs and builder are vitcli.jobs.trace."""

from __future__ import annotations

from typing import Any

from vitcli.context import CommandContext
from vitcli.jobs.trace import trace_jobs
from vitcli.options import ImagesArgument
from vitcli.shell import vitcli_command


@vitcli_command(
    "trace",
    builder=trace_jobs,
    examples=[
        "vitcli trace examples/images/newfoundland_31.jpg",
        "vitcli trace examples/images/newfoundland_31.jpg --token 0,63,74 --blocks 1,12 --values 5",
        "vitcli trace examples/images/Persian_98.jpg --token r4c6 --blocks all --format json",
    ],
)
def trace_command(context: CommandContext, images: ImagesArgument = None, **options: Any) -> None:
    """Every stage from pixels to probabilities for the followed rows, each checked against timm's own forward."""
    context.run(trace_jobs(**options), images)
