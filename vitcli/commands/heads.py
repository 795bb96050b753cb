"""`vitcli heads`: the Typer command and its options; its Jobs and their builder are vitcli.jobs.heads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vitcli.context import CommandContext
from vitcli.errors import AlreadyReported
from vitcli.jobs.heads import DEFAULT_BLOCKS, DEFAULT_K, heads_jobs
from vitcli.options import ImagesArgument
from vitcli.shell import vitcli_command


@vitcli_command(
    "heads",
    examples=[
        "vitcli heads photos/ --texts bank.txt --model open_clip:ViT-B-32/openai",
        "vitcli heads photos/ --texts bank.txt --model open_clip:ViT-B-16-SigLIP --blocks 2 --k 10",
    ],
)
def heads_command(
    context: CommandContext,
    images: ImagesArgument = None,
    texts: Annotated[
        Path | None,
        typer.Option("--texts", help="The text bank: a UTF-8 file, one text per line.", show_default=False),
    ] = None,
    blocks: Annotated[
        int | None,
        typer.Option(
            "--blocks",
            help=f"Describe the heads of this many last blocks (default {DEFAULT_BLOCKS} as in the paper, or all if "
            "fewer).",
            show_default=False,
        ),
    ] = None,
    k: Annotated[int, typer.Option("--k", help="Texts per head, chosen greedily by the variance they explain.")] = (
        DEFAULT_K
    ),
) -> None:
    """Each head of the last blocks described by a few texts (TextSpan, Gandelsman et al., ICLR 2024): over the
    images, the texts whose directions explain most of the head's direct contribution to the image embedding, with
    the share of the head's variance each explains. Needs a model with a text tower (CLIP, SigLIP via open_clip)."""
    from vitcli.runner import Report, progress_display

    jobs = context.plan(heads_jobs(None if texts is None else str(texts), blocks, k))
    paths = context.images(images)
    for job in jobs:
        job.check_images(len(paths))
    model = context.model()
    for job in jobs:
        job.check_texts(model)
    report = Report()
    with progress_display(context.show_progress(len(paths))) as progress:
        context.session(model).run(jobs, paths, report, progress)
    context.emitter.finish()
    if report.failures:
        raise AlreadyReported("")
