"""Running a config in one process: the model loads once, each image is decoded and preprocessed once, the clean
forward runs once per batch of images and every experiment shares it.

Results land in OUTPUT/RUN_NAME/ (the same files the single commands write) with manifest.json and summary.csv,
written after every batch of images and when the run ends or is interrupted. Re-running the same config skips the
(image, experiment) pairs that the manifest lists and whose files the store finds complete, unless `force`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitcli.batch.config import RunConfig, located
from vitcli.batch.manifest import Manifest, merge, read_manifests, stem, summary_frame
from vitcli.errors import UsageError, VitcliError
from vitcli.naming import safe_name
from vitcli.output import json_text
from vitcli.store import OutputStore, ResultFiles

if TYPE_CHECKING:
    from vitcli.context import CommandContext
    from vitcli.runner import Report


FEW_IMAGES = 6  # up to this many images, the closing table has one column per image
FEW_COLUMNS = 5  # beyond that, it shows the image and this many summary columns


def check_experiments(context: CommandContext, config: RunConfig) -> None:
    """Every experiment's usage checks against the architecture, with the config key they came from."""
    for experiment in config.experiments:
        try:
            context.check(experiment.jobs)
        except UsageError as error:
            raise UsageError(located(experiment.path, str(error))) from error


def execute(context: CommandContext, config: RunConfig, arguments: list[str] | None, force: bool) -> Report:
    from vitcli.runner import Report, Runner, progress_display

    check_experiments(context, config)
    if not arguments and not config.images:
        raise UsageError(f"no images: give IMAGE arguments or `images = [...]` in {config.path}")
    jobs = [job for experiment in config.experiments for job in experiment.jobs]
    image_jobs = [job for job in jobs if job.scope == "image"]
    report = Report()
    paths = context.images(arguments or config.images, report)
    model = context.model()
    root = context.output_dir / safe_name(config.name, "run")
    provenance = context.provenance(model)
    shard = f"{context.shard.index}/{context.shard.count}" if context.shard else None
    identity = config.identity({"model": model.name, "parameters_sha256": model.parameter_sha256})
    publisher = context.publisher(provenance, store_root=root)
    publisher.announce_files = False
    store = publisher.store
    manifest = _resume(root, shard, identity, force) or Manifest(
        config.name, identity, config.as_run(context.explicit_options, [str(path) for path in paths]), provenance, shard
    )

    def complete(subject: str, name: str) -> bool:
        return manifest.has(subject, name) and store.is_complete(publisher.folder(subject), name)

    def save() -> None:
        manifest.failures = []
        for failure in report.failures:
            manifest.fail(failure)
        save_manifest(store, root, manifest)

    runner = Runner(model, publisher, context.fail_fast, skip=complete)
    runner.on_published = lambda published: manifest.add(published, root)
    runner.on_chunk_done = save
    try:
        runner.run_once([job for job in jobs if job.scope == "model"], report)
        with progress_display(context.show_progress(len(paths))) as progress:
            runner.run(image_jobs, paths, report, progress)
        runner.publish_across_images(paths, report)
    finally:
        save()
    if report.skipped:
        context.messages.info(f"skipped {len(report.skipped)} results already complete (use --force to redo them)")
    context.emitter.table(summary_table(manifest, root))
    context.messages.info(f"wrote {root / (stem('manifest', shard) + '.json')} and {stem('summary', shard)}.csv")
    return report


def summary_table(manifest: Manifest, root: Path) -> Any:
    """summary.csv as a rich table, numbers to 4 significant digits: one column per image when there are a few
    (the headline numbers read down), else the first columns of one row per image (all of them in summary.csv)."""
    from rich.table import Table

    from vitcli.render import weights_caption

    frame = summary_frame(manifest.results).drop(columns=["image_sha256"])
    caption = weights_caption(manifest.provenance["weights_label"])
    table = Table(title=f"{root}: {len(frame)} images (all numbers in summary.csv)", caption=caption)
    if len(frame) <= FEW_IMAGES:
        table.add_column("")
        for image in frame["image"]:
            table.add_column(Path(image).name, justify="right")
        for column in frame.columns[1:]:
            table.add_row(str(column), *(_cell(value) for value in frame[column]))
        return table
    shown = list(frame.columns[: 1 + FEW_COLUMNS])
    for column in shown:
        table.add_column(str(column), justify="left" if column == "image" else "right")
    for row in frame[shown].itertuples(index=False):
        table.add_row(*(_cell(value) for value in row))
    return table


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def _resume(root: Path, shard: str | None, identity: str, force: bool) -> Manifest | None:
    path = root / f"{stem('manifest', shard)}.json"
    if force or not path.is_file():
        return None
    try:
        manifest = Manifest.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, VitcliError):
        return None
    if manifest.identity != identity:
        raise UsageError(
            f"{root} holds a run of another config or model: choose another `name` in the config, another "
            "--output-dir, or pass --force to start it afresh"
        )
    manifest.failures = []
    return manifest


def save_manifest(store: OutputStore, root: Path, manifest: Manifest) -> list[Path]:
    """manifest.json, then summary.csv, each published through the store (whole or not at all)."""
    folder = store.folder()
    manifest_text = json_text(manifest.to_json()) + "\n"
    written = store.write(folder, ResultFiles(stem("manifest", manifest.shard), {"json": manifest_text}))
    summary_text = summary_frame(manifest.results).to_csv(index=False)
    return written + store.write(folder, ResultFiles(stem("summary", manifest.shard), {"csv": summary_text}))


def merge_runs(folders: list[Path], into: Path) -> tuple[Manifest, list[Path]]:
    manifests = [item for folder in folders for item in read_manifests(folder)]
    merged = merge(manifests, into)
    return merged, save_manifest(OutputStore(into), into, merged)
