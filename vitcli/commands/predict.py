"""`vitcli predict`: the Typer command; its options, Jobs and builder are vitcli.jobs.predict."""

from __future__ import annotations

from typing import Any

from vitcli.context import CommandContext
from vitcli.jobs.predict import predict_jobs
from vitcli.options import ImagesArgument
from vitcli.shell import vitcli_command


@vitcli_command(
    "predict",
    builder=predict_jobs,
    examples=[
        "vitcli predict examples/images/newfoundland_31.jpg",
        "vitcli predict examples/images --top-k 3 --format csv",
        "vitcli predict photos/ --format jsonl --weights random | jq .result.top[0]",
    ],
)
def predict_command(context: CommandContext, images: ImagesArgument = None, **options: Any) -> None:
    """Top-k classes with probabilities, for one image or many (batched)."""
    context.run(predict_jobs(**options), images)
