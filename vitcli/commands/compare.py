"""`vitcli compare`: the Typer command; its options, Job and builder are vitcli.jobs.compare."""

from __future__ import annotations

from typing import Any

from vitcli.context import CommandContext
from vitcli.errors import UsageError
from vitcli.jobs.compare import compare_jobs
from vitcli.options import ImagesArgument
from vitcli.shell import vitcli_command


@vitcli_command(
    "compare",
    builder=compare_jobs,
    examples=[
        "vitcli compare examples/images/newfoundland_31.jpg examples/images/Persian_98.jpg",
        "vitcli compare examples/images/newfoundland_31.jpg examples/images/Persian_98.jpg --class 283 "
        '--class "Newfoundland dog"',
        "vitcli compare photos/ --top-k 3 --format json",
        "vitcli compare photos/ --pairs A~C,B~D",
    ],
)
def compare_command(context: CommandContext, images: ImagesArgument = None, **options: Any) -> None:
    """Same model, different inputs: CLS rows block by block (A~B and the pairs asked for), the classifier readout,
    CLS vs mean pooling, and the similarity of every pair's final features as an N x N heat map (two or more
    images)."""
    from vitcli.runner import Report

    jobs = context.plan(compare_jobs(**options))
    paths = context.images(images)
    if len(paths) < 2:
        raise UsageError(f"compare needs at least two images, got {len(paths)}: {', '.join(map(str, paths))}")
    for job in jobs:
        job.check_images(len(paths))
    jobs = [job.plan_images(len(paths)) for job in jobs]
    # One result about the images together: a failure (an unreadable image) ends the command with its own message.
    context.session(context.model(), reraise=True).run(jobs, paths, Report())
    context.emitter.finish()
