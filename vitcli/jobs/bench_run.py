"""`vitcli bench` run through the batch engine: the images (the user's, paired with their masks, or generated scenes)
become an in-memory config of one bench experiment that vitcli.batch.execute runs, so --shard, resuming and
`vitcli merge` work as for `vitcli run`; then the leaderboard is printed.

With --scenes N and --mosaics M the generated scenes (vitcli.scenes) are the run's images, written through the output
store: OUTPUT/bench/scenes-sSEED-nN-mM/images/STEM.png and .../masks/STEM.png with STEM.json (the scene's true class,
kind and, for mosaics, quadrants), which bench reads beside the mask. Scenes already written are kept."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitcli.errors import UsageError, VitcliError
from vitcli.naming import setting
from vitcli.store import OutputStore, ResultFiles

if TYPE_CHECKING:
    from vitcli.context import CommandContext

RUN_NAME = "bench"


@dataclass(frozen=True)
class SceneFolders:
    images: Path
    masks: Path


def scene_folder_name(seed: int, scenes: int | None, mosaics: int | None) -> str:
    return "-".join(
        part for part in ("scenes", setting("s", seed), setting("n", scenes), setting("m", mosaics)) if part
    )


def _png(array: Any) -> bytes:
    from PIL import Image

    stream = io.BytesIO()
    Image.fromarray(array).save(stream, format="PNG")
    return stream.getvalue()


def publish_scenes(store: OutputStore, seed: int, scenes: int | None, mosaics: int | None) -> SceneFolders:
    """Generate the scenes (vitcli.scenes, seeded) and write each image and mask through `store`; a scene whose files
    the store already holds complete is not generated again."""
    from vitcli import scenes as generator

    name = scene_folder_name(seed, scenes, mosaics)
    folders = SceneFolders(store.folder(RUN_NAME, name, "images"), store.folder(RUN_NAME, name, "masks"))
    for kind, count in (("single", scenes), ("mosaic", mosaics)):
        if not count:
            continue
        stems = [f"{kind}-{index:05d}" for index in range(count)]
        if all(store.is_complete(folders.images, stem) and store.is_complete(folders.masks, stem) for stem in stems):
            continue
        for stem, scene in zip(stems, generator.scenes(seed, count, kind), strict=True):
            facts = {
                "label": int(scene.label),
                "class": generator.CLASS_NAMES[scene.label],
                "kind": scene.kind,
                "quadrants": list(scene.quadrants),
                "seed": seed,
            }
            record = {"command": "bench", "settings": {"scene_seed": seed, "kind": kind}}
            store.write(folders.images, ResultFiles(stem, {"png": _png(scene.image)}, record))
            mask = scene.mask.astype("uint8") * 255
            store.write(folders.masks, ResultFiles(stem, {"png": _png(mask), "json": json.dumps(facts) + "\n"}, record))
    return folders


def run_bench(
    context: CommandContext,
    images: list[str] | None,
    options: dict[str, Any],
    scenes: int | None,
    mosaics: int | None,
    scene_seed: int,
    force: bool,
) -> None:
    """Check everything before the model loads, write the scenes (if asked), run, print the leaderboard."""
    from vitcli.batch.config import Experiment, RunConfig
    from vitcli.batch.execute import execute
    from vitcli.experiments.bench import check_scenes
    from vitcli.jobs.bench import bench_jobs

    check_scenes(scenes, mosaics, scene_seed)
    generated = scenes is not None or mosaics is not None
    if generated and images:
        raise UsageError("give IMAGES (with --masks DIR) or --scenes/--mosaics, not both")
    if generated and options["masks"] is not None:
        raise UsageError("--masks: generated scenes bring their own masks; leave it out with --scenes or --mosaics")
    if not generated and not images:
        raise UsageError("nothing to grade: give IMAGES with --masks DIR, or --scenes N")
    jobs = bench_jobs(**options, masks_later=generated)
    (job,) = jobs
    context.check(jobs)  # every refusal before a scene is written or any weights load
    if generated:
        folders = publish_scenes(OutputStore(context.output_dir), scene_seed, scenes, mosaics)
        job.use_masks(folders.masks)
        options = {**options, "masks": str(folders.masks)}  # the run's identity: which scenes
        paths = context.images([str(folders.images)], shard=False)
    else:
        paths = context.images(images, shard=False)
        if job.audits.masks is not None:
            paths = _with_masks(context, paths, job.audits.masks)
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
    _show_leaderboard(context, job, paths)
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
