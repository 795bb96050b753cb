"""`vitcli bench`: the Typer command and its options; its Job is vitcli.jobs.bench, run through the batch engine
(vitcli.batch.execute) so that --shard, resuming and `vitcli merge` work as for `vitcli run`."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from vitcli.commands.explain_options import (
    BaselineOption,
    IgStepsOption,
    NoiseOption,
    NoiseSeedOption,
    RadiusOption,
    SamplesOption,
    SanitySeedOption,
)
from vitcli.context import CommandContext
from vitcli.experiments.bench import SCORE_OPTIONS
from vitcli.experiments.explain_options import DEFAULT_IG_STEPS, DEFAULT_NOISE, DEFAULT_RADIUS, DEFAULT_SAMPLES
from vitcli.jobs.bench import BENCH_METHODS, BENCH_STEPS
from vitcli.jobs.explain_options import Baseline
from vitcli.jobs.occlude import Fill
from vitcli.shell import vitcli_command

BenchMethod = StrEnum("BenchMethod", {name.replace("-", "_"): name for name in BENCH_METHODS})
_SCENES = "Scenes"


@vitcli_command(
    "bench",
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
    method: Annotated[
        list[BenchMethod] | None,
        typer.Option(
            "--method",
            "-M",
            help="Methods to grade (repeatable): explain's methods, random (a random map) and edge (an edge map) as "
            "baselines. Default: all; one that cannot run on the model gets a row saying why.",
            show_default=False,
        ),
    ] = None,
    scores: Annotated[
        str | None,
        typer.Option(
            help=f"Comma-separated scores: {', '.join(SCORE_OPTIONS)} (default: all). focus needs --mosaics; "
            "pointing and mass need masks.",
            show_default=False,
        ),
    ] = None,
    masks: Annotated[
        Path | None,
        typer.Option(
            help="Folder of the images' masks, IMAGE_STEM.png each (non-zero = object; trimaps: 1 = object), of the "
            "image's size; images without one are left out with a warning.",
            show_default=False,
        ),
    ] = None,
    scenes: Annotated[
        int | None,
        typer.Option(help="Generate this many scenes with object masks and grade them.", rich_help_panel=_SCENES),
    ] = None,
    mosaics: Annotated[
        int | None,
        typer.Option(help="Generate this many 2x2 mosaics (Focus).", rich_help_panel=_SCENES, show_default=False),
    ] = None,
    scene_seed: Annotated[int, typer.Option(help="Seed of the generated scenes.", rich_help_panel=_SCENES)] = 0,
    block: Annotated[
        int | None,
        typer.Option(help="Block Grad-CAM and attention read (default: the last).", show_default=False),
    ] = None,
    fill: Annotated[
        Fill, typer.Option(help="What covered pixels become (occlusion, deletion, insertion).")
    ] = Fill.gray,
    steps: Annotated[
        int | None,
        typer.Option(help=f"Deletion and insertion points (default {BENCH_STEPS}).", show_default=False),
    ] = None,
    ig_steps: IgStepsOption = DEFAULT_IG_STEPS,
    baseline: BaselineOption = Baseline.gray,
    samples: SamplesOption = DEFAULT_SAMPLES,
    noise: NoiseOption = DEFAULT_NOISE,
    noise_seed: NoiseSeedOption = 0,
    radius: RadiusOption = DEFAULT_RADIUS,
    sanity_seed: SanitySeedOption = 0,
    force: Annotated[
        bool, typer.Option("--force", help="Redo every result, even those an earlier run completed.")
    ] = False,
) -> None:
    """Grade every explanation method against ground truth: pointing game, relevance mass, Focus, ROAD, deletion and
    insertion AUC, the randomisation sanity test and max-sensitivity, per image and as a leaderboard (mean and 95%
    bootstrap interval per method and score) in OUTPUT/bench/, which `vitcli report` shows."""
    from vitcli.jobs.bench_run import run_bench

    run_bench(
        context,
        images,
        dict(
            method=method,
            scores=scores,
            masks=None if masks is None else str(masks),
            block=block,
            fill=fill,
            steps=steps,
            ig_steps=ig_steps,
            baseline=baseline,
            samples=samples,
            noise=noise,
            noise_seed=noise_seed,
            radius=radius,
            sanity_seed=sanity_seed,
        ),
        scenes,
        mosaics,
        scene_seed,
        force,
    )
