"""`vitcli heads`: the Typer command; its options, Jobs and builder are vitcli.jobs.heads."""

from __future__ import annotations

from typing import Any

from vitcli.context import CommandContext
from vitcli.errors import AlreadyReported
from vitcli.jobs.heads import heads_jobs
from vitcli.options import ImagesArgument
from vitcli.shell import vitcli_command


@vitcli_command(
    "heads",
    builder=heads_jobs,
    examples=[
        "vitcli heads photos/ --texts bank.txt --model open_clip:ViT-B-32/openai",
        "vitcli heads photos/ --texts bank.txt --model open_clip:ViT-B-16-SigLIP --blocks 2 --k 10",
    ],
)
def heads_command(context: CommandContext, images: ImagesArgument = None, **options: Any) -> None:
    """Each head of the last blocks described by a few texts (TextSpan, Gandelsman et al., ICLR 2024): over the
    images, the texts whose directions explain most of the head's direct contribution to the image embedding, with
    the share of the head's variance each explains. Needs a model with a text tower (CLIP, SigLIP via open_clip)."""
    from vitcli.runner import Report, progress_display

    jobs = context.plan(heads_jobs(**options))
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
