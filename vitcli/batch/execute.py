"""Running a config in one process: the model loads once, each image is decoded and preprocessed once, the clean
forward runs once per batch of images and every experiment shares it.

Results land in OUTPUT/RUN_NAME/ (the same files the single commands write). Each result is appended to this
process's record (vitcli.batch.record) as it is published; manifest.json and summary.csv are views of this run's
images in every record of the folder (images recorded there but no longer among the inputs are listed as not in this
run), written when the run ends or is interrupted. Re-running the same config skips the (image, experiment)
pairs that any record of the folder lists, whose image still has the recorded SHA-256 and whose files the store finds
complete, unless `force`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitcli.batch.config import Experiment, RunConfig, located
from vitcli.batch.manifest import Manifest, plain_cells, stem, summary_frame
from vitcli.batch.record import Record, RecordWriter, read_record
from vitcli.batch.views import ACROSS, VIEWS_LOCK, Scope, merge_runs, record_view, stored_document, write_views
from vitcli.errors import UsageError
from vitcli.filenames import escaped_path, path_from_escaped
from vitcli.hashing import file_sha256
from vitcli.naming import MODEL_SUBJECT, image_subject, safe_name, set_subject
from vitcli.output import counted
from vitcli.store import OutputStore
from vitcli.targets import bind_targets

if TYPE_CHECKING:
    from vitcli.context import CommandContext
    from vitcli.jobs import Job
    from vitcli.runner import Report


FEW_IMAGES = 6  # up to this many images, the closing table has one column per image
FEW_COLUMNS = 5  # beyond that, it shows the image and this many summary columns


def plan_experiments(context: CommandContext, config: RunConfig) -> list[Experiment]:
    """Every experiment with its jobs planned against the architecture (their usage checks, refused with the config
    key they came from); the config's own experiments are left as they were."""
    from vitcli.context import plan_jobs

    architecture = context.architecture  # the model options' own refusals (--template) come first, in no experiment
    planned = []
    for experiment in config.experiments:
        try:
            planned.append(replace(experiment, jobs=plan_jobs(architecture, experiment.jobs)))
        except UsageError as error:
            raise UsageError(located(experiment.path, str(error))) from error
    return planned


def execute(context: CommandContext, config: RunConfig, arguments: list[str] | None, force: bool) -> Report:
    from vitcli.runner import Report, progress_display
    from vitcli.session import Session

    experiments = plan_experiments(context, config)
    if not arguments and not config.images:
        raise UsageError(f"no images: give IMAGE arguments or `images = [...]` in {config.path}")
    report = Report()
    # Canonical (absolute, normalized) paths: an image spelled relative or absolute is one image of the record. Every
    # shard's share is known, so that the views tell this run's other images from images no longer in its inputs.
    found = context.images(arguments or config.images, report, shard=False)
    inputs = list(dict.fromkeys(Path(os.path.abspath(path)) for path in found))
    paths = context.shard.select(inputs) if context.shard else inputs
    about_the_set = [experiment for experiment in experiments if any(job.scope == "set" for job in experiment.jobs)]
    if about_the_set and context.shard is not None:
        # A result about the images together (CKA, say) from one shard's share would be another number, and shards
        # run apart: such views need the whole set in one process. (Named by its key: a result's name may depend on
        # the number of images, compare's `pairs = "all"`.)
        experiment = about_the_set[0]
        raise UsageError(
            f"--shard {context.shard.index}/{context.shard.count}: {experiment.path} ({experiment.command}) is about "
            "the run's images together and needs them all in one process; run it without --shard (in a config of "
            "its own)"
        )
    jobs: list[Job] = []  # every experiment's, planned for the images
    for experiment in experiments:
        for job in experiment.jobs:
            try:
                job.check_images(len(paths))
            except UsageError as error:
                raise UsageError(located(experiment.path, str(error))) from error
            jobs.append(job.plan_images(len(paths)))
    root = OutputStore(context.output_dir).folder(safe_name(config.name, "run"))
    model = context.model()
    bind_targets(jobs, model)
    provenance = context.provenance(model)
    shard = f"{context.shard.index}/{context.shard.count}" if context.shard else None
    identity = config.identity({"model": model.name, "parameters_sha256": model.parameter_sha256})
    warn = _once(context.messages.warn)  # the record is read at the start and again for the views
    publisher = context.publisher(provenance, store_root=root)
    publisher.announce_files = False
    store = publisher.store
    record = _earlier_record(store, root, identity, force, warn)
    run_line = {
        "name": config.name,
        "identity": identity,
        "shard": shard,
        "config": config.as_run(context.explicit_options, [escaped_path(path) for path in paths]),
        "provenance": provenance,
        "result_names": [job.name() for job in jobs],
    }
    writer = RecordWriter(store, run_line)
    session = Session(model, publisher, context.fail_fast, skip=None if force else _done(record, root))
    session.on_published(lambda published: writer.result(published, root))
    session.on_failure(writer.failure)
    for failure in report.failures:  # arguments that named no image, before the runner existed
        writer.failure(failure)
    scope = Scope(
        writer.path,
        [escaped_path(path) for path in paths],
        {image_subject(path) for path in paths}
        | {MODEL_SUBJECT, set_subject(paths)}
        | {subject for job in jobs if job.scope == "model" and (subject := job.once_subject())},
        {image_subject(path) for path in inputs},
        {failure.subject for failure in report.failures},
    )
    try:
        with progress_display(context.show_progress(len(paths))) as progress:
            session.run(jobs, paths, report, progress)
    except BaseException:
        writer.close()
        _views_after_failure(store, root, shard, scope, warn)
        raise
    writer.close()
    with store.exclusive(VIEWS_LOCK):
        manifest = record_view(read_record(root, warn), shard, scope)
        write_views(store, manifest)
    report.not_in_this_run = len(manifest.not_in_this_run)
    if report.skipped:
        context.messages.info(
            f"skipped {counted(len(report.skipped), 'result')} already complete (use --force to redo them)"
        )
    table, left_out = summary_table(manifest, root)
    context.emitter.table(table)
    if left_out:
        context.messages.info(
            f"the table leaves out {counted(len(left_out), 'column')} (all in summary.csv): {', '.join(left_out)}"
        )
    context.messages.info(f"wrote {root / (stem('manifest', shard) + '.json')} and {stem('summary', shard)}.csv")
    return report


def _once(warn: Callable[[str], None]) -> Callable[[str], None]:
    said: set[str] = set()

    def warn_once(text: str) -> None:
        if text not in said:
            said.add(text)
            warn(text)

    return warn_once


def _earlier_record(store: OutputStore, root: Path, identity: str, force: bool, warn: Callable[[str], None]) -> Record:
    """What earlier processes recorded in this run folder. Records of another config or model are refused, or, with
    --force, removed (the run starts afresh)."""
    record = read_record(root, warn)
    others = [run for run in record.runs if run["identity"] != identity]
    if others and not force:
        raise UsageError(
            f"{root} holds a run of another config or model: choose another `name` in the config, another "
            "--output-dir, or pass --force to start it afresh"
        )
    if others:
        for run in others:
            store.remove(run["file"])
        record = read_record(root, warn)
    return record


def _done(record: Record, root: Path) -> Any:
    """Whether a result is complete: recorded by any process, on an image whose bytes still have the recorded
    SHA-256, with files the store finds complete."""
    hashes: dict[Path, str | None] = {}

    def complete(subject: str, name: str, image: Path | None) -> bool:
        line = record.results.get((subject, name))
        if line is None or not line["files"]:
            return False
        if image is not None:
            if image not in hashes:
                try:
                    hashes[image] = file_sha256(image)
                except OSError:
                    hashes[image] = None
            if hashes[image] != line["image_sha256"]:
                return False
        folder = (root / line["files"][0]).parent
        return OutputStore(root).is_complete(folder, name)

    return complete


def _views_after_failure(
    store: OutputStore, root: Path, shard: str | None, scope: Scope, warn: Callable[[str], None]
) -> None:
    """On an interrupt or a failure: the views of what was recorded, best effort (the error in flight is the one to
    report; a second signal stops this too, leaving the earlier views whole)."""
    try:
        with store.exclusive(VIEWS_LOCK):
            write_views(store, record_view(read_record(root, warn), shard, scope))
    except Exception:  # noqa: BLE001  (a read-only or vanished folder: the error in flight already says so)
        return


def summary_table(manifest: Manifest, root: Path) -> tuple[Any, list[str]]:
    """summary.csv as a rich table, numbers to 4 significant digits: one column per image when there are a few
    (the headline numbers read down), else the first columns of one row per image; and the columns left out.

    Images are named by what tells them apart: the file name, then its folder below the images' common folder
    (which the title names). Long names and headers fold onto more lines rather than lose their ends."""
    from rich.table import Table
    from rich.text import Text

    from vitcli.render import weights_caption

    frame = plain_cells(summary_frame(manifest.results, manifest.result_names).drop(columns=["image_sha256"]))
    caption = weights_caption(manifest.provenance["weights_label"])
    common, labels = _image_labels([str(image) for image in frame["image"]])
    images = counted(len(frame), "image") + (f" in {common}" if common else "")
    table = Table(title=Text(f"{root}: {images} (all numbers in summary.csv)"), caption=caption)
    if len(frame) <= FEW_IMAGES:
        table.add_column("", overflow="fold")
        for label in labels:
            table.add_column(label, justify="right", overflow="fold")
        for column in frame.columns[1:]:
            table.add_row(Text(str(column)), *(_cell(value) for value in frame[column]))
        return table, []
    shown = list(frame.columns[: 1 + FEW_COLUMNS])
    table.add_column("image", overflow="fold")
    for column in shown[1:]:
        table.add_column(Text(str(column)), justify="right", overflow="fold")
    for label, row in zip(labels, frame[shown[1:]].itertuples(index=False), strict=True):
        table.add_row(label, *(_cell(value) for value in row))
    return table, [str(column) for column in frame.columns[1 + FEW_COLUMNS :]]


def _image_labels(images: list[str]) -> tuple[str, list[Any]]:
    """The images' common folder and, for each image, its file name followed by its folder below that one."""
    from rich.text import Text

    folders = [os.path.dirname(image) for image in images]
    try:
        common = os.path.commonpath(folders) if folders else ""
    except ValueError:  # absolute and relative paths mixed: nothing in common
        common = ""
    labels = []
    for image, folder in zip(images, folders, strict=True):
        below = os.path.relpath(folder, common) if common else folder
        label = Text(os.path.basename(image))
        if below not in ("", os.curdir):
            label.append(f" in {below}", style="dim")
        labels.append(label)
    return common, labels


def _cell(value: Any) -> Any:
    """A summary value as text (a label or a class name is never markup)."""
    from rich.text import Text

    if isinstance(value, float):
        return f"{value:.4g}"
    return Text("" if value is None else str(value))


def merge_folders(
    context: CommandContext, folders: list[Path], into: Path, config: str | None = None
) -> tuple[Manifest, list[Path]]:
    """`vitcli merge`: the runs' records (or manifests) as one manifest and summary in `into`, with each job's result
    about the whole image set recomputed from every image's stored result; only `config`'s runs when given."""

    def publish_set(merged: Manifest) -> list[dict[str, Any]]:
        return _across_images(context, merged, into)

    return merge_runs(folders, into, _once(context.messages.warn), publish_set, config)


def _across_images(context: CommandContext, merged: Manifest, into: Path) -> list[dict[str, Any]]:
    from vitcli.batch.record import result_entry
    from vitcli.jobs import ACROSS_IMAGES, AcrossImages
    from vitcli.publisher import Publisher
    from vitcli.runner import Published

    by_experiment: dict[str, list[dict[str, Any]]] = {}
    for entry in merged.results:
        if entry["image"] and entry["command"] in ACROSS_IMAGES:
            by_experiment.setdefault(entry["experiment"], []).append(entry)
    entries = []
    for name, results in by_experiment.items():
        results.sort(key=lambda entry: entry["image"])
        documents = [document for entry in results if (document := stored_document(into, entry)) is not None]
        job_class = ACROSS_IMAGES[results[0]["command"]]
        presentation = job_class.present_across_images(documents) if len(documents) > 1 else None
        if presentation is None:
            continue
        model_folder = Path(results[0]["files"][0]).parent.parent.name
        publisher = Publisher(OutputStore(into), model_folder, context.emitter, context.messages, merged.provenance)
        publisher.announce_files = False
        images = [path_from_escaped(entry["image"]) for entry in results]
        settings = {**results[0]["settings"], "images": len(documents)}
        job = AcrossImages(results[0]["command"], f"{name}{ACROSS}", settings, presentation)
        subject = set_subject(images)
        paths, _ = publisher.publish(subject, {"images": [escaped_path(image) for image in images]}, job, None)
        entries.append(result_entry(Published(subject, None, job, paths, 0.0, 0.0, presentation.summary), into))
    return entries
