"""`vitcli trace`: the Typer command and its options; its Jobs and their builder are vitcli.jobs.trace."""

from __future__ import annotations

from typing import Annotated

import typer

from vitcli.context import CommandContext
from vitcli.jobs.trace import trace_jobs
from vitcli.options import ImagesArgument
from vitcli.shell import vitcli_command


@vitcli_command(
    "trace",
    examples=[
        "vitcli trace examples/images/newfoundland_31.jpg",
        "vitcli trace examples/images/newfoundland_31.jpg --token 0,63,74 --blocks 1,12 --values 5",
        "vitcli trace examples/images/Persian_98.jpg --token r4c6 --blocks all --format json",
    ],
)
def trace_command(
    context: CommandContext,
    images: ImagesArgument = None,
    token: Annotated[
        list[str] | None,
        typer.Option(
            "--token",
            "-t",
            help="Rows followed in full: 0 or cls, 63, P63, r4c6 (zero-based), comma-separated or repeated "
            "(default: CLS).",
            show_default=False,
        ),
    ] = None,
    blocks: Annotated[
        list[str] | None,
        typer.Option(
            "--blocks",
            "-b",
            help="Blocks opened in full (one-based): 1, 1,12, 3-5, all or none (default: 1); the others get one "
            "summary line each.",
            show_default=False,
        ),
    ] = None,
    values: Annotated[
        int, typer.Option("--values", min=1, help="Leading values shown per vector (JSON keeps full rows).")
    ] = 3,
) -> None:
    """Every stage from pixels to probabilities for the followed rows, each checked against timm's own forward."""
    context.run(trace_jobs(token, blocks, values), images)
