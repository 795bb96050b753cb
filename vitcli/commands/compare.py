"""`vitcli compare`: the Typer command and its options; its Job and builder are vitcli.jobs.compare."""

from __future__ import annotations

from typing import Annotated

import typer

from vitcli.context import CommandContext
from vitcli.errors import UsageError
from vitcli.jobs.compare import DEFAULT_TOP_K, compare_jobs
from vitcli.options import ImagesArgument
from vitcli.shell import vitcli_command


@vitcli_command(
    "compare",
    examples=[
        "vitcli compare examples/images/newfoundland_31.jpg examples/images/Persian_98.jpg",
        "vitcli compare examples/images/newfoundland_31.jpg examples/images/Persian_98.jpg --class 283 "
        '--class "Newfoundland dog"',
        "vitcli compare photos/ --top-k 3 --format json",
        "vitcli compare photos/ --pairs A~C,B~D",
    ],
)
def compare_command(
    context: CommandContext,
    images: ImagesArgument = None,
    classes: Annotated[
        list[str] | None,
        typer.Option(
            "--class",
            "-c",
            help='Classes for the readout w_c . h + b_c: an index (283) or a label ("sports car"); repeatable '
            "(default: each image's top-1).",
            show_default=False,
        ),
    ] = None,
    top_k: Annotated[
        int | None,
        typer.Option(
            "--top-k",
            "-k",
            help=f"Classes listed per image and readout (default {DEFAULT_TOP_K}, or the model's classes if fewer).",
            show_default=False,
        ),
    ] = None,
    pairs: Annotated[
        str | None,
        typer.Option(
            "--pairs",
            help="Pairs traced block by block besides A~B: letters or 1-based numbers joined by ~, comma-separated "
            "(A~C,B~D or 1~3), or 'all'; at most 10 pairs. Every pair's final similarity is in the N x N matrix.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Same model, different inputs: CLS rows block by block (A~B and the pairs asked for), the classifier readout,
    CLS vs mean pooling, and the similarity of every pair's final features as an N x N heat map (two or more
    images)."""
    from vitcli.runner import Report

    jobs = context.plan(compare_jobs(classes, top_k, pairs))
    paths = context.images(images)
    if len(paths) < 2:
        raise UsageError(f"compare needs at least two images, got {len(paths)}: {', '.join(map(str, paths))}")
    for job in jobs:
        job.check_images(len(paths))
    jobs = [job.plan_images(len(paths)) for job in jobs]
    # One result about the images together: a failure (an unreadable image) ends the command with its own message.
    context.session(context.model(), reraise=True).run(jobs, paths, Report())
    context.emitter.finish()
