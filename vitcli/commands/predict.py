"""`vitcli predict`: the Typer command and its options; its Jobs and their builder are vitcli.jobs.predict."""

from __future__ import annotations

from typing import Annotated

import typer

from vitcli.context import CommandContext
from vitcli.jobs.predict import DEFAULT_TOP_K, predict_jobs
from vitcli.options import ImagesArgument
from vitcli.shell import vitcli_command


@vitcli_command(
    "predict",
    examples=[
        "vitcli predict examples/images/newfoundland_31.jpg",
        "vitcli predict examples/images --top-k 3 --format csv",
        "vitcli predict photos/ --format jsonl --weights random | jq .result.top[0]",
    ],
)
def predict_command(
    context: CommandContext,
    images: ImagesArgument = None,
    top_k: Annotated[
        int | None,
        typer.Option(
            "--top-k",
            "-k",
            help=f"How many classes to list per image (default {DEFAULT_TOP_K}, or the model's classes if fewer).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Top-k classes with probabilities, for one image or many (batched)."""
    context.run(predict_jobs(top_k), images)
