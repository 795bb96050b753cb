"""`vitcli ablate`: the Typer command; its options, Jobs and builder are vitcli.jobs.ablate."""

from __future__ import annotations

from typing import Any

from vitcli.context import CommandContext
from vitcli.jobs.ablate import ablate_jobs
from vitcli.options import ImagesArgument
from vitcli.shell import vitcli_command


@vitcli_command(
    "ablate",
    builder=ablate_jobs,
    examples=[
        "vitcli ablate examples/images/newfoundland_31.jpg",
        "vitcli ablate photos/ --heads 10.1,11.3 --blocks 11.attn,11.mlp --mode mean",
        "vitcli ablate photo.jpg --mode resample --reference other_photos/",
    ],
)
def ablate_command(context: CommandContext, images: ImagesArgument = None, **options: Any) -> None:
    """Ablate heads (or whole attention and MLP sublayers) one at a time, all ablations of an image as batched
    forwards: the change of the target logit and probability and whether the top-1 changes."""
    context.run(ablate_jobs(**options, run_images=images or []), images)
