"""`vitcli lens`: the Typer command; its options, Jobs and builder are vitcli.jobs.lens."""

from __future__ import annotations

from typing import Any

from vitcli.context import CommandContext
from vitcli.jobs.lens import lens_jobs
from vitcli.options import ImagesArgument
from vitcli.shell import vitcli_command


@vitcli_command(
    "lens",
    builder=lens_jobs,
    examples=[
        "vitcli lens examples/images/newfoundland_31.jpg",
        "vitcli lens photos/ --target Newfoundland --format csv",
    ],
)
def lens_command(context: CommandContext, images: ImagesArgument = None, **options: Any) -> None:
    """Logit lens: the model's final norm and head read the CLS row (and the mean of the patch rows) after every
    block; the target's probability and rank and the top-1 per block, checked to equal the logits at the last."""
    context.run(lens_jobs(**options), images)
