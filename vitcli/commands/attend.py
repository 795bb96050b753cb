"""`vitcli attend`: the Typer command; its options, Jobs and builder are vitcli.jobs.attend."""

from __future__ import annotations

from typing import Any

from vitcli.context import CommandContext
from vitcli.jobs.attend import attend_jobs
from vitcli.options import ImagesArgument
from vitcli.shell import vitcli_command


@vitcli_command(
    "attend",
    builder=attend_jobs,
    examples=[
        "vitcli attend examples/images/newfoundland_31.jpg --block 4 --head 1 --query 74",
        "vitcli attend examples/images/newfoundland_31.jpg --view all-blocks --all-heads --query r5c3",
        "vitcli attend examples/images --view summary --query all --format csv",
    ],
)
def attend_command(context: CommandContext, images: ImagesArgument = None, **options: Any) -> None:
    """Exact attention of one query for any block and head: table, maps, summaries and rollout.

    The attention is softmax(q k^T * scale) over all tokens (CLS included), never renormalized; nothing is printed
    unless the explicit computation reproduces the model's own attention output.
    """
    context.run(attend_jobs(**options), images)
