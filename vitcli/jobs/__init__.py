"""What every command hands the runner: a `Job` (one configured experiment) and the `Presentation` of its result.

Each command's Jobs and their builder live in a module of this package (vitcli.jobs.ablate, ...), below the command
line: the command's Typer function (vitcli.commands), `vitcli run` configs and the Python API call the same builder
with the command's own options. Each Job is planned against the architecture before any weights load (Job.plan
returns a new, validated Job and changes nothing); the runner computes the planned Job per image, turns the result
into a Presentation and gives that to the output store (files) and the emitter (stdout). Nothing here imports torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from pathlib import Path

    from rich.console import RenderableType
    from torch import Tensor

    from vitcli.architecture import Architecture
    from vitcli.model import PreparedImage, VitModel


@dataclass
class Presentation:
    """A result as people and programs see it; built by a presentation module, never recomputing anything."""

    table: RenderableType  # what `--format table` prints
    rows: list[dict[str, Any]]  # long-form CSV rows; the emitter and store add image and model columns
    document: dict[str, Any]  # the JSON body; the store adds provenance, the image and the experiment
    figure: Callable[[], Any] | None = None  # builds the matplotlib figure; called only when files are written
    # More files: suffix -> text or bytes (written as is, e.g. a headerless "grid.csv", an array "relevance.npy"),
    # -> a function writing the bytes when files are written (a second figure), or -> CSV rows (written with the
    # same image and model columns as the main CSV, e.g. "curves.csv").
    extra_files: dict[str, str | bytes | Callable[[Any], None] | list[dict[str, Any]]] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)  # headline numbers for a batch run's summary.csv

    @classmethod
    def of(cls, view: Any, result: Any) -> Presentation:
        """From a presentation module with the usual functions: table, rows, document, figure (if any), summary."""
        figure = getattr(view, "figure", None)
        return cls(
            view.table(result),
            view.rows(result),
            view.document(result),
            figure=None if figure is None else lambda: figure(result),
            summary=view.summary(result),
        )


class Steps:
    """Progress inside one job (occlusion batches, say); the runner replaces it with a progress bar."""

    def start(self, total: int, description: str) -> None:
        """A new sub-task of `total` steps begins."""

    def advance(self, count: int = 1) -> None:
        """`count` steps of the current sub-task are done."""


@dataclass
class ImageWork:
    """One prepared image and what experiments on it share: the model and its clean forward, computed once."""

    model: VitModel
    image: PreparedImage
    steps: Steps = field(default_factory=Steps)
    clean: Tensor | None = None  # (classes,) logits of the unperturbed image, filled in batches by the runner

    def clean_logits(self) -> Tensor:
        if self.clean is None:
            self.clean = self.model.logits(self.image.input.unsqueeze(0))[0]
        return self.clean


class SetImages(list):  # list[Path]: the jobs about a set read it as the list of its paths
    """The images of a job about the images together, in the run's order, with those that the run's per-image jobs
    already decoded and preprocessed (kept only for a job that holds every image at once, `Job.holds_every_image`)."""

    def __init__(self, paths: Iterable[Path], prepared: Mapping[Path, PreparedImage] | None = None):
        super().__init__(paths)
        self.prepared = dict(prepared or {})

    def prepare(self, model: VitModel, path: Path) -> PreparedImage:
        """`model.prepare(path)`, or the image the run already prepared from the same file."""
        kept = self.prepared.get(path)
        return kept if kept is not None else model.prepare(path)


class Job(ABC):
    """One experiment with its settings, runnable on any number of images."""

    command: ClassVar[str]  # the CLI command (and `vitcli run` experiment) that makes this job
    needs_classes: ClassVar[bool] = True  # refused on a model without a classifier head
    # False: the result depends on the architecture alone, and a session without weights can compute it
    # (vitcli.session.UnloadedModel); its files then say so in their provenance (`provenance`)
    needs_weights: ClassVar[bool] = True
    # "image": computed per image; "model": once per run, about the model alone; "set": once per run, about all its
    # images together (statistics that no one image's result holds, such as CKA across the images)
    scope: ClassVar[str] = "image"
    # A job of scope "set" whose compute_set holds every image's preparation at once (compare): the runner keeps the
    # images that the run's per-image jobs prepared and hands them over (SetImages.prepare) instead of decoding them
    # again. The others stream through any number of images and decode each as they go.
    holds_every_image: ClassVar[bool] = False

    @abstractmethod
    def name(self) -> str:
        """The stem of the result's files: the experiment's kind and the settings that made it (vitcli.naming)."""

    @abstractmethod
    def settings(self) -> dict[str, Any]:
        """The settings as JSON values, for the files' provenance, the index and a run's manifest."""

    def uses(self) -> tuple[str, ...]:
        """The keys of capture.support.COMMAND_NEEDS that say what this job needs of the model: the command, or the
        command with each option that makes it read more of the model (`attend --view rollout`)."""
        return (self.command,)

    def plan(self, architecture: Architecture) -> Job:
        """This job planned for `architecture`, before weights load: settings it cannot satisfy (block 13 of 12...)
        refused with UsageError, and a new job returned with every value that depends on it resolved (parsed heads,
        token numbers, defaults fitted to the model) in its `planned`. The job planned is left as it was, so one job
        can be planned for several models; a job with nothing to resolve returns itself."""
        return self

    @property
    def planned(self) -> Any:
        """What plan() resolved: the job's own frozen record of plain values, given to its constructor."""
        if self._planned is None:
            raise JobNotPlanned(
                f"the {self.command} job was named or run before plan(architecture) resolved its settings"
            )
        return self._planned

    _planned: Any = None

    def check_images(self, count: int) -> None:  # noqa: B027  (most jobs take any number of images)
        """Refuse a number of images the job cannot use (CKA of one image...) with UsageError, before weights load."""

    def plan_images(self, count: int) -> Job:
        """This job for a run of `count` images (after check_images): a new job with what depends on their number
        resolved (compare's `--pairs all`); the job planned is left as it was. Most jobs: itself."""
        return self

    def compute(self, work: ImageWork) -> Any:
        """The typed result for one image (jobs of scope "image")."""
        raise NotImplementedError(f"{self.command} computes once per run, not per image")

    def compute_once(self, model: VitModel) -> Any:
        """The typed result about the model alone (jobs of scope "model"), for `vitcli run`."""
        raise NotImplementedError(f"{self.command} computes per image")

    def compute_set(self, model: VitModel, paths: SetImages, steps: Steps) -> Any:
        """The typed result about the run's images together (jobs of scope "set")."""
        raise NotImplementedError(f"{self.command} does not compute over a set of images")

    def subject_of(self, result: Any) -> dict[str, Any] | None:
        """The subject JSON of a result not about one image, when the result describes it better than the runner can
        (compare's images with their hashes, probe's data folder); None: the set's paths, or none for the model."""
        return None

    def once_subject(self) -> str | None:
        """The subject folder of a result of scope "model" that is about something besides the model (probe's data
        folder); None: `model`."""
        return None

    def provenance(self, run: dict[str, Any]) -> dict[str, Any]:
        """The provenance of this job's files, given the run's (the loaded model, the command line): the run's, or,
        for a result that needs no weights, what the result does depend on, whichever front end computed it."""
        return run

    def attach(self, publisher: Any) -> None:  # noqa: B027  (most jobs keep nothing in the store)
        """The run's publisher, before compute_set, for a job that keeps a cache in the output store (heads' text
        embeddings); not called where results are kept in memory (the Python API)."""

    @abstractmethod
    def present(self, result: Any) -> Presentation:
        """The result as table, rows, JSON body, figure and summary."""

    @classmethod
    def present_across_images(cls, documents: list[dict[str, Any]]) -> Presentation | None:
        """What the stored results of several images say together (mean and spread, say), or None when nothing does.

        `documents` are the `result` bodies of the images' JSON files, as stored: whichever processes, shards or
        earlier runs computed them, the numbers about the set are the same as a fresh run's. A class method, so that
        `vitcli merge` can call it for a command without rebuilding the job."""
        return None

    @property
    def aggregates(self) -> bool:
        """Whether the runner should publish `present_across_images` of this job's results about the set."""
        return type(self).present_across_images.__func__ is not Job.present_across_images.__func__  # type: ignore[attr-defined]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "present_across_images" in vars(cls) and "command" in vars(cls):
            ACROSS_IMAGES[cls.command] = cls


class JobNotPlanned(RuntimeError):
    """A job's name, settings or computation asked for before plan(architecture): a bug of the caller, not the user's
    (every runner plans its jobs first), so no one-line refusal but an internal error."""


# Job classes that sum up several images, by command: `vitcli merge` recomputes their results about the set.
ACROSS_IMAGES: dict[str, type[Job]] = {}


class AcrossImages(Job):
    """A job's results over a set of images, already presented, published as one more result about the set."""

    def __init__(self, command: str, name: str, settings: dict[str, Any], presentation: Presentation):
        self.command = command  # type: ignore[misc]  (an instance's command: the job it sums up)
        self._name = name
        self._settings = settings
        self.presentation = presentation

    def name(self) -> str:
        return self._name

    def settings(self) -> dict[str, Any]:
        return self._settings

    def present(self, result: Any) -> Presentation:
        return self.presentation


# Each image command's module in this package registers how the command's own options (everything but the images and
# the shared options) become Jobs; the command calls it, and so do `vitcli run` and the API, which find its module in
# vitcli.job_registry's table.
JOB_BUILDERS: dict[str, Callable[..., list[Job]]] = {}


def builds_jobs(command: str) -> Callable[[Callable[..., list[Job]]], Callable[..., list[Job]]]:
    """Register `function(**options) -> list[Job]` for `command`; its parameters are the command's own options, each
    declared once as `Annotated[T, typer.Option(...)]` for the command line, configs and the API
    (vitcli.declared_options)."""

    def register(function: Callable[..., list[Job]]) -> Callable[..., list[Job]]:
        JOB_BUILDERS[command] = function
        return function

    return register
