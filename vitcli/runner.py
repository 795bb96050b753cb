"""Running jobs over images: one code path for one image and for a folder of thousands.

Images are decoded and preprocessed once, in chunks of the model's batch size; the chunk's clean forward runs once,
batched, and every job shares it. Each (image, job) result is handed to the publisher (vitcli.publisher), which
presents it, writes it through the output store and prints it, as soon as it is ready. A bad image, or a job failing
on one image, is reported on stderr (and in JSON output) and the run goes on; `fail_fast` stops at the first failure
instead.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitcli.errors import VitcliError
from vitcli.filenames import escaped_path
from vitcli.jobs import AcrossImages, ImageWork, Job, Presentation, SetImages, Steps
from vitcli.naming import MODEL_SUBJECT, image_subject
from vitcli.output import counted
from vitcli.publisher import Publisher, stored_documents
from vitcli.store import StoreError

if TYPE_CHECKING:
    from vitcli.model import PreparedImage, VitModel
    from vitcli.session import UnloadedModel


@dataclass
class Published:
    """One result written: what a batch run's manifest and summary are made of."""

    subject: str  # the subject folder name
    image: dict[str, Any] | None  # the image's path, SHA-256, size (None for results about the model alone)
    job: Job
    files: list[Path]
    compute_seconds: float  # the experiment itself: forwards and arithmetic
    write_seconds: float  # presentation, figure and files
    summary: dict[str, Any]
    result: Any = None  # the experiment's typed result, for the Python API
    presentation: Presentation | None = None


@dataclass
class Failure:
    subject: str  # the image path (or argument) that failed, escaped as outputs write it (vitcli.filenames)
    job: str | None  # the result name, or None when the image itself could not be read
    message: str


@dataclass
class Report:
    images: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (subject, result name) already complete
    failures: list[Failure] = field(default_factory=list)
    not_in_this_run: int = 0  # a batch run: images its folder recorded that are not among its images

    @property
    def failed_images(self) -> int:
        return len({failure.subject for failure in self.failures})

    def counts(self) -> str:
        done = self.images - self.failed_images
        text = f"{done} of {counted(self.images, 'image')} done" + (
            f", {self.failed_images} failed" if self.failures else ""
        )
        if self.not_in_this_run:
            earlier = counted(self.not_in_this_run, "image")
            verb = "is" if self.not_in_this_run == 1 else "are"
            text += (
                f"; {earlier} recorded earlier {verb} not in this run (their results stay on disk; see the manifest)"
            )
        return text


class Runner:
    def __init__(
        self,
        model: VitModel | UnloadedModel,
        publisher: Publisher,
        fail_fast: bool,
        skip: Callable[[str, str, Path | None], bool] | None = None,
    ):
        self.model = model
        self.publisher = publisher
        self.fail_fast = fail_fast
        # (subject, result name, image path or None) -> whether that result is already complete (resumed runs)
        self.skip = skip
        self.on_published: Callable[[Published], None] = lambda _published: None  # runs with the files in place
        self.on_failure: Callable[[Failure], None] = lambda _failure: None
        self.aggregating: dict[str, Job] = {}  # jobs run on images whose results sum up over the set, by name
        # True: a failure is raised as it came, not reported and passed over (one call of the Python API, a command
        # about one set of images: their caller reports the error itself)
        self.reraise = False
        # The images that per-image jobs prepared, kept for a job about the set that holds them all at once
        # (`keeps_prepared`, set by the session): such a job reads them instead of decoding them again.
        self.keeps_prepared = False
        self.prepared: dict[Path, PreparedImage] = {}

    def run(self, jobs: Sequence[Job], paths: Sequence[Path], report: Report, progress: Any = None) -> Report:
        steps = ProgressSteps(progress)
        report.images += len(paths)
        self.aggregating.update({job.name(): job for job in jobs if job.aggregates})
        overall = progress.add_task("images x experiments", total=len(paths) * len(jobs)) if progress else None
        for start in range(0, len(paths), self.model.batch_size):
            todo: dict[Path, list[Job]] = {}
            for path in paths[start : start + self.model.batch_size]:
                subject = image_subject(path)
                todo[path] = [job for job in jobs if self.skip is None or not self.skip(subject, job.name(), path)]
                report.skipped.extend((subject, job.name()) for job in jobs if job not in todo[path])
                if progress is not None:
                    progress.advance(overall, len(jobs) - len(todo[path]))
            works, unreadable = self._prepare([path for path, pending in todo.items() if pending], report, steps)
            if self.keeps_prepared:
                self.prepared.update((path, work.image) for path, work in works)
            self._share_clean_forward(works, jobs)
            for path, work in works:
                for job in todo[path]:
                    self._run_one(job, work, image_subject(path), report)
                    if progress is not None:
                        progress.advance(overall)
            if unreadable is not None:
                self.fail(report, unreadable)  # --fail-fast: after the images before it, nothing after it
        return report

    def publish_across_images(self, paths: Sequence[Path], report: Report) -> None:
        """For each job that sums up several images, one more result about the set, computed from the stored results
        of every image of the set (whichever process computed them), when two or more are stored. Always recomputed:
        reading the stored results costs little, and any of them may have changed since (a replaced image)."""
        from vitcli.naming import set_subject

        if len(paths) < 2:  # one image's result is all there is to say about it
            return
        subject = set_subject(paths)
        subject_json = {"images": [escaped_path(path) for path in paths]}
        for job in self.aggregating.values():
            name = f"{job.name()}-across-images"
            documents = stored_documents(self.publisher, [image_subject(path) for path in paths], job.name())
            presentation = type(job).present_across_images(documents) if len(documents) > 1 else None
            if presentation is not None:
                summary = AcrossImages(job.command, name, {**job.settings(), "images": len(documents)}, presentation)
                self._compute_and_publish(summary, lambda: None, subject, subject_json, subject, report)

    def run_once(self, jobs: Sequence[Job], report: Report) -> None:
        """Jobs about the model alone (compare-patch-size's counts), or about something other than the run's images
        (probe's data folder): each once, in the `model` folder or the job's own."""
        for job in jobs:
            subject = job.once_subject() or MODEL_SUBJECT
            if self.skip is not None and self.skip(subject, job.name(), None):
                report.skipped.append((subject, job.name()))
            else:
                if self.publisher.keeps_caches:
                    job.attach(self.publisher)
                compute = functools.partial(job.compute_once, self.model)
                self._compute_and_publish(job, compute, subject, None, subject, report, job.subject_of)

    def run_over_set(
        self, jobs: Sequence[Job], paths: Sequence[Path], report: Report, progress: Any = None, steps: Any = None
    ) -> None:
        """Jobs about the images together (anatomy's CKA, say): each once over all of `paths`, in the set's folder.
        Never skipped as already complete: any image of the set may have changed since (a replaced file)."""
        from vitcli.naming import set_subject

        if not jobs or not paths:
            return
        subject = set_subject(paths)
        subject_json = {"images": [escaped_path(path) for path in paths]}
        steps = steps or ProgressSteps(progress)
        images, self.prepared = SetImages(paths, self.prepared), {}
        for job in jobs:
            if self.publisher.keeps_caches:
                job.attach(self.publisher)
            compute = functools.partial(job.compute_set, self.model, images, steps)
            self._compute_and_publish(job, compute, subject, subject_json, subject, report, job.subject_of)

    def _prepare(
        self, chunk: Sequence[Path], report: Report, steps: Steps
    ) -> tuple[list[tuple[Path, ImageWork]], Failure | None]:
        """The chunk's images decoded and preprocessed; with --fail-fast, those before the first unreadable one and
        that image's failure."""
        works = []
        for path in chunk:
            try:
                works.append((path, ImageWork(self.model, self.model.prepare(path), steps)))
            except VitcliError as error:
                if self.reraise:
                    raise
                failure = Failure(escaped_path(path), None, str(error))
                if self.fail_fast:
                    return works, failure
                self.fail(report, failure)
        return works, None

    def _share_clean_forward(self, works: list[tuple[Path, ImageWork]], jobs: Sequence[Job]) -> None:
        """One batched forward for the chunk's clean images, which every class-reading job reuses."""
        if not works or not any(job.needs_classes for job in jobs):
            return
        import torch

        logits = self.model.logits(torch.stack([work.image.input for _, work in works]))
        for (_, work), row in zip(works, logits, strict=True):
            work.clean = row

    def _run_one(self, job: Job, work: ImageWork, subject: str, report: Report) -> None:
        source = work.image.source
        self._compute_and_publish(
            job, lambda: job.compute(work), subject, source.to_json(), source.display_path, report
        )

    def _compute_and_publish(
        self,
        job: Job,
        compute: Callable[[], Any],
        subject: str,
        subject_json: dict[str, Any] | None,
        failure_subject: str,
        report: Report,
        subject_of: Callable[[Any], dict[str, Any] | None] | None = None,
    ) -> None:
        """Compute one result, publish it and record it; a failure is reported and the run goes on. `subject_of`,
        given the result, may describe the subject better than `subject_json` (a set's images with their hashes)."""
        started = time.perf_counter()

        def stored(paths: list[Path], presentation: Presentation) -> None:
            # With the files in place and indexed, before a held-back signal: the run's record of them.
            timing = (computed - started, time.perf_counter() - computed)
            published = Published(subject, described, job, paths, *timing, presentation.summary, result, presentation)
            self.on_published(published)

        try:
            result = compute()
            computed = time.perf_counter()
            described = subject_json
            if subject_of is not None:
                described = subject_of(result) or subject_json
            self.publisher.publish(subject, described, job, result, stored)
        except StoreError:
            raise  # a full disk or a read-only folder fails every image after it too: stop with one line
        except VitcliError as error:
            if self.reraise:
                raise
            self.fail(report, Failure(failure_subject, job.name(), str(error)))

    def fail(self, report: Report, failure: Failure) -> None:
        report.failures.append(failure)
        self.on_failure(failure)
        line = failure.message if failure.subject in failure.message else f"{failure.subject}: {failure.message}"
        if self.fail_fast:
            raise VitcliError(f"{line} (stopped by --fail-fast)")
        self.publisher.messages.error(line)
        self.publisher.emitter.failure(failure.subject, failure.message)


class ProgressSteps(Steps):
    """A job's inner steps as a transient bar under the overall one."""

    def __init__(self, progress: Any):
        self.progress = progress
        self.task = None

    def start(self, total: int, description: str) -> None:
        if self.progress is None:
            return
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(description, total=total)

    def advance(self, count: int = 1) -> None:
        if self.progress is not None and self.task is not None:
            self.progress.advance(self.task, count)


class LineSteps(Steps):
    """A job's inner steps as plain lines where stderr is no terminal (a log file, a pipe, a batch job's output),
    which a bar would fill with redraws: one line whenever another tenth of a sub-task is done."""

    def __init__(self, say: Callable[[str], None]):
        self.say = say
        self.description, self.total, self.done, self.tenths = "", 0, 0, 0

    def start(self, total: int, description: str) -> None:
        self.description, self.total, self.done, self.tenths = description, total, 0, 0

    def advance(self, count: int = 1) -> None:
        self.done += count
        tenths = 10 * self.done // self.total if self.total else 0
        if tenths > self.tenths:
            self.tenths = tenths
            self.say(f"{self.description}: {10 * tenths}% ({self.done:,} of {self.total:,})")


@contextmanager
def progress_display(enabled: bool) -> Iterator[Any]:
    """A rich progress display on stderr (images and steps done, time left), or None when disabled."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn("{task.description}", markup=False),  # descriptions name images: a file name is no markup
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
        redirect_stdout=False,
        redirect_stderr=False,
    ) as progress:
        yield progress
