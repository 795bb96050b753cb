"""`vitcli bench` run through the batch engine, the command line's front end over vitcli.jobs.bench: the images (the
user's, paired with their masks, or generated scenes) become an in-memory config of one bench experiment that
vitcli.batch.execute runs, so --shard, resuming and `vitcli merge` work as for `vitcli run`; then the leaderboard is
printed. It imports nothing of the command line (the command, vitcli.commands.bench, calls it).

With --scenes N and --mosaics M the generated scenes (vitcli.scenes) are the run's images, written through the output
store in vitcli.scenes' layout: OUTPUT/bench/scenes-sSEED-nN-mM/NAME.png, masks/NAME.png and labels.csv (each scene's
true class, kind and, for mosaics, target quadrants), which bench reads beside the images. Scenes already written are
kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitcli.batch.config import Experiment, RunConfig
from vitcli.errors import UsageError, VitcliError
from vitcli.naming import setting
from vitcli.store import OutputStore, ResultFiles

if TYPE_CHECKING:
    from vitcli.context import CommandContext

RUN_NAME = "bench"


def scene_folder_name(seed: int, scenes: int | None, mosaics: int | None) -> str:
    return "-".join(
        part for part in ("scenes", setting("s", seed), setting("n", scenes), setting("m", mosaics)) if part
    )


def publish_scenes(store: OutputStore, seed: int, scenes: int | None, mosaics: int | None) -> Path:
    """Generate the scenes (vitcli.scenes, seeded) and write them through `store` in vitcli.scenes' layout (NAME.png,
    masks/NAME.png, labels.csv); returns the images' folder. Scenes the store already holds complete are kept."""
    from vitcli import scenes as generator

    name = scene_folder_name(seed, scenes, mosaics)
    images, masks = store.folder(RUN_NAME, name), store.folder(RUN_NAME, name, "masks")
    rows = []
    for kind, count in (("single", scenes), ("mosaic", mosaics)):
        for index in range(count or 0):
            stem = generator.scene_name(kind, index)
            record = {"command": "bench", "seed": seed, "index": index, "kind": kind}
            scene = generator.scene(seed, index, kind)
            if not (store.is_complete(images, stem) and store.is_complete(masks, stem)):
                store.write(images, ResultFiles(stem, {"png": generator.png_bytes(scene.image)}, record))
                store.write(masks, ResultFiles(stem, {"png": generator.png_bytes(scene.mask)}, record))
            rows.append(generator.labels_row(stem, scene))
    labels = {"csv": generator.labels_csv(rows)}
    store.write(images, ResultFiles("labels", labels, {"command": "bench", "seed": seed}))
    return images


def run_bench(context: CommandContext, images: list[str] | None, options: dict[str, Any]) -> None:
    """`options`: the builder's (vitcli.jobs.bench.bench_jobs) as the command line gave them. Check everything before
    the model loads, write the scenes (if asked), run, print the leaderboard."""
    from vitcli.batch.execute import execute
    from vitcli.experiments.bench import check_scenes
    from vitcli.jobs.bench import COMMAND_ONLY, bench_jobs

    options = dict(options)
    scenes, mosaics, scene_seed, force = (options.pop(name) for name in COMMAND_ONLY)
    check_scenes(scenes, mosaics, scene_seed)
    generated = scenes is not None or mosaics is not None
    if generated and images:
        raise UsageError("give IMAGES (with --masks DIR) or --scenes/--mosaics, not both")
    if generated and options["masks"] is not None:
        raise UsageError("--masks: generated scenes bring their own masks; leave it out with --scenes or --mosaics")
    if not generated and not images:
        raise UsageError("nothing to grade: give IMAGES with --masks DIR, or --scenes N")
    jobs = bench_jobs(**options, masks_later=generated)
    (planned,) = context.plan(jobs)  # every refusal before a scene is written or any weights load
    if generated:
        folder = publish_scenes(OutputStore(context.output_dir), scene_seed, scenes, mosaics)
        options["masks"] = folder / "masks"  # the run's identity: which scenes
        jobs = bench_jobs(**options)
        (planned,) = context.plan(jobs)  # named with the scenes' masks
        paths = context.images([str(folder)], shard=False)
    else:
        paths = context.images(images, shard=False)
        if planned.audits.masks is not None:
            paths = _with_masks(context, paths, planned.audits.masks)
    config = RunConfig(
        path=Path("vitcli bench"),
        name=RUN_NAME,
        images=[str(path) for path in paths],
        model_options={},
        output_dir=None,
        figures=None,
        target=None,
        experiments=[Experiment(0, "bench", options, jobs)],
        text="",
    )
    context.emitter.tidy_csv = True
    context.emitter.show_tables = False
    report = execute(context, config, None, force)
    _show_leaderboard(context, planned, paths)
    context.emitter.finish()
    context.finish(report)


def _with_masks(context: CommandContext, paths: list[Path], folder: Path) -> list[Path]:
    """The images with a mask of their size; the others named in one warning."""
    from vitcli.experiments.bench import pair_masks

    paired = pair_masks(paths, folder)
    warning = paired.warning()
    if not paired.kept:
        raise VitcliError(f"no image has a usable mask in {folder}: {warning}")
    if warning is not None:
        context.messages.warn(warning)
    return paired.kept


def _show_leaderboard(context: CommandContext, job: Any, paths: list[Path]) -> None:
    """The leaderboard this run published over its images (this shard's, with --shard), read back from its JSON."""
    import os

    from vitcli.experiments.bench import LeaderboardRow
    from vitcli.naming import set_subject
    from vitcli.presentation.bench import leaderboard_table

    inputs = [Path(os.path.abspath(path)) for path in paths]
    mine = context.shard.select(inputs) if context.shard else inputs
    root = context.output_dir / RUN_NAME / context.model_folder / set_subject(mine)
    path = root / f"{job.name()}-across-images.json"
    if not path.is_file():
        return
    listed = json.loads(path.read_text(encoding="utf-8"))["result"]["leaderboard"]
    fields = LeaderboardRow.__dataclass_fields__
    context.emitter.table(leaderboard_table([LeaderboardRow(**{k: row[k] for k in fields}) for row in listed]))
