"""`vitcli bench`: the Typer command; its options, Job and builder are vitcli.jobs.bench, and vitcli.batch.bench runs
it through the batch engine, so that --shard, resuming and `vitcli merge` work as for `vitcli run`."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from vitcli.context import CommandContext
from vitcli.jobs.bench import bench_jobs
from vitcli.shell import vitcli_command


@vitcli_command(
    "bench",
    builder=bench_jobs,
    examples=[
        "vitcli bench examples/images/shapes --masks examples/images/shapes/masks --model shapes",
        "vitcli bench --scenes 100 --mosaics 20 --scene-seed 1",
        "vitcli bench photos/ --masks photos-masks/ --scores pointing,mass,deletion,insertion",
        "vitcli bench --scenes 200 --shard 1/2 && vitcli bench --scenes 200 --shard 2/2 && vitcli merge outputs/bench",
    ],
)
def bench_command(
    context: CommandContext,
    images: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="IMAGE",
            help="Image files, folders or globs to grade, with --masks DIR (or none, with --scenes).",
            show_default=False,
        ),
    ] = None,
    **options: Any,
) -> None:
    """Grade every explanation method against ground truth: pointing game, relevance mass, Focus, ROAD, deletion and
    insertion AUC, the randomisation sanity test and max-sensitivity, per image and as a leaderboard (mean and 95%
    bootstrap interval per method and score) in OUTPUT/bench/, which `vitcli report` shows."""
    from vitcli.batch.bench import run_bench

    run_bench(context, images, options)
