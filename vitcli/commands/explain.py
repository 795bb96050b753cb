"""`vitcli explain`: the Typer command; its options, Jobs and builder are vitcli.jobs.explain."""

from __future__ import annotations

from typing import Any

from vitcli.context import CommandContext
from vitcli.jobs.explain import explain_jobs
from vitcli.options import ImagesArgument
from vitcli.shell import vitcli_command


@vitcli_command(
    "explain",
    builder=explain_jobs,
    examples=[
        "vitcli explain examples/images/newfoundland_31.jpg",
        "vitcli explain photo.jpg --method relevance --method gradcam --method occlusion --faithfulness",
        "vitcli explain photos/ --method gradcam --block 8 --target Newfoundland --format csv",
    ],
)
def explain_command(context: CommandContext, images: ImagesArgument = None, **options: Any) -> None:
    """Explanation maps on the patch grid for one class, side by side over the crop, with raw values; with
    --faithfulness, deletion and insertion curves that rank the maps against random orders."""
    context.run(explain_jobs(**options), images)
