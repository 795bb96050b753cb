"""`vitcli attribute`: the Typer command; its options, Jobs and builder are vitcli.jobs.attribute."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from vitcli.context import CommandContext
from vitcli.jobs.attribute import attribute_jobs
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
    builder=attribute_jobs,
    examples=[
        "vitcli attribute examples/images/newfoundland_31.jpg",
        "vitcli attribute photo.jpg --by head --target Newfoundland --contrast Persian",
        "vitcli attribute photo.jpg --by token --block 11",
    ],
)
def attribute_command(context: CommandContext, images: ImagesArgument = None, **options: Any) -> None:
    """Direct logit attribution: the target logit split exactly into what the embedding, each block's attention
    and MLP, each head or each source token wrote, with the final LayerNorm's scale frozen; checked to add up."""
    context.run(attribute_jobs(**options), images)
