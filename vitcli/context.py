"""One command run: its shared options and the services built from them (model, store, emitter, runner).

Nothing here imports torch or timm at import time; the model loads on first use, once per process.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitcli.errors import AlreadyReported, UsageError, VitcliError
from vitcli.hashing import file_sha256
from vitcli.jobs import Job
from vitcli.naming import model_folder
from vitcli.output import Emitter, Messages
from vitcli.spec import WeightsSpec
from vitcli.store import OutputStore

if TYPE_CHECKING:
    from vitcli.architecture import Architecture
    from vitcli.model import VitModel
    from vitcli.publisher import Publisher
    from vitcli.runner import Report
    from vitcli.session import Session, UnloadedModel

DEFAULT_OUTPUT = Path("outputs")


@dataclass(frozen=True)
class Shard:
    index: int  # K, one-based
    count: int  # N

    @classmethod
    def parse(cls, text: str) -> Shard:
        parts = text.split("/")
        # ASCII digits only: str.isdigit also accepts superscripts such as "²", which int() then refuses.
        if len(parts) != 2 or not all(re.fullmatch(r"[0-9]+", part.strip()) for part in parts):
            raise UsageError(f"--shard {text!r}: write it as K/N, e.g. 1/4 for the first of four shares")
        index, count = int(parts[0]), int(parts[1])
        if not 1 <= index <= count:
            raise UsageError(f"--shard {text}: K must be between 1 and N ({count})")
        return cls(index, count)

    def select(self, paths: Sequence[Path]) -> list[Path]:
        """Every N-th image of the sorted list, starting at the K-th: the N shares never overlap and cover all."""
        ordered = sorted(paths, key=lambda path: str(path.absolute()))
        return ordered[self.index - 1 :: self.count]


@dataclass
class CommandContext:
    command: str
    spec: WeightsSpec
    device: str
    batch_size: int | None
    output_dir: Path
    format: str
    quiet: bool
    figures: bool = True  # False: results are written without their PNG (--no-figures)
    fail_fast: bool = False
    shard: Shard | None = None
    explicit_options: dict[str, Any] = field(default_factory=dict)  # shared options typed on the command line
    option_values: dict[str, Any] = field(default_factory=dict)  # every shared option's value, defaults included
    messages: Messages = field(init=False)
    emitter: Emitter = field(init=False)

    def __post_init__(self) -> None:
        self.messages = Messages(self.quiet)
        self.emitter = Emitter(self.format, self.quiet)

    # ----- the model

    def model(self) -> VitModel:
        from vitcli.loading import load_model

        model = load_model(self.spec, self.device, self.batch_size)
        from vitcli.zero_shot import single_label_warning

        warning = single_label_warning(model)
        if warning is not None:
            self.messages.warn(warning)
        return model

    @cached_property
    def architecture(self) -> Architecture:
        """The architecture's facts without loading weights: for usage checks before the model loads."""
        from vitcli.loading import describe

        return describe(self.spec)

    def plan(self, jobs: Sequence[Job]) -> list[Job]:
        """Every job planned against the architecture (its usage checks), before any weights load."""
        return plan_jobs(self.architecture, jobs)

    @property
    def command_line(self) -> str:
        return " ".join(["vitcli", *(_shell_word(argument) for argument in sys.argv[1:])])

    def provenance(self, model: VitModel) -> dict[str, Any]:
        return {**model.provenance(), "weights_label": model.spec.label, "command": self.command_line}

    @cached_property
    def model_folder(self) -> str:
        checkpoint = self.spec.checkpoint
        digest = file_sha256(checkpoint) if checkpoint is not None and checkpoint.is_file() else None
        folder = model_folder(self.spec.model_name, self.spec.random, self.spec.seed, checkpoint, digest)
        spec = self.spec
        if (spec.labels or spec.label_names or spec.templates) and "text_tower" in self.architecture.features:
            from vitcli.zero_shot import texts_key

            folder += f"-texts-{texts_key(spec)}"  # zero-shot labels and templates change the model's outputs
        return folder

    # ----- images and running

    def images(self, arguments: Sequence[str] | None, report: Report | None = None, shard: bool = True) -> list[Path]:
        """The images of a run: arguments expanded (an unusable argument is a failure of the report, not the end),
        or the sample photo when there are none; then this process's --shard (unless `shard` is False)."""
        from vitcli.filenames import escaped_path
        from vitcli.images import resolve_images, sample_photo

        if not arguments:
            photo = sample_photo()
            self.messages.info(f"no image given: using the sample photo {photo}")
            return [photo]
        paths: list[Path] = []
        for argument in arguments:
            try:
                paths.extend(resolve_images([argument]))
            except VitcliError as error:
                if report is None or self.fail_fast:
                    raise
                from vitcli.runner import Failure

                report.images += 1
                report.failures.append(Failure(escaped_path(argument), None, str(error)))
                self.messages.error(str(error))
                self.emitter.failure(escaped_path(argument), str(error))
        paths = list(dict.fromkeys(paths))
        return self.shard.select(paths) if self.shard is not None and shard else paths

    def publisher(self, provenance: dict[str, Any], store_root: Path | None = None) -> Publisher:
        from vitcli.publisher import Publisher

        store = OutputStore(store_root or self.output_dir)
        publisher = Publisher(store, self.model_folder, self.emitter, self.messages, provenance)
        publisher.figures = self.figures
        return publisher

    def unloaded_model(self) -> UnloadedModel:
        """The model as jobs that need no weights read it: the spec, and the device and batch size that `model()`
        would load it with."""
        from vitcli.loading import default_batch_size, resolve_device
        from vitcli.session import UnloadedModel

        device = resolve_device(self.device)
        return UnloadedModel(self.spec, device, self.batch_size or default_batch_size(device))

    def session(self, model: VitModel | UnloadedModel, reraise: bool = False) -> Session:
        """A session on `model` publishing into the output folder (vitcli.session). An unloaded model's session
        runs only jobs that need no weights, whose files carry their own provenance (`Job.provenance`)."""
        from vitcli.session import Session, UnloadedModel

        loaded = not isinstance(model, UnloadedModel)
        provenance = self.provenance(model) if loaded else {"command": self.command_line}
        return Session(model, self.publisher(provenance), self.fail_fast, reraise=reraise)

    def run(self, jobs: Sequence[Job], arguments: Sequence[str] | None) -> Report:
        """The whole life of an image command: plan, load once, run every job on every image, count, exit status."""
        from vitcli.runner import Report, progress_display
        from vitcli.targets import bind_targets

        jobs = self.plan(jobs)
        report = Report()
        paths = self.images(arguments, report)
        if paths:
            model = self.model()
            bind_targets(jobs, model)
            with progress_display(self.show_progress(len(paths))) as progress:
                self.session(model).run(jobs, paths, report, progress)
        self.emitter.finish()
        self.finish(report)
        return report

    def finish(self, report: Report) -> None:
        if report.failures and report.images == 1:
            raise AlreadyReported("")
        if report.failures:
            raise VitcliError(report.counts())
        if report.images > 1 or report.not_in_this_run:
            self.messages.info(report.counts())

    def show_progress(self, images: int) -> bool:
        return not self.quiet and sys.stderr.isatty() and images > 0


def plan_jobs(architecture: Architecture, jobs: Sequence[Job]) -> list[Job]:
    """Every job planned against an architecture (the commands', `vitcli run`'s and the Python API's): first whether
    the model's family has what the job needs (capture.support), then the job's own settings (Job.plan). The jobs
    given are left as they were; the planned ones are what runs."""
    from vitcli.capture.support import require_support

    planned = []
    for job in jobs:
        # A job given --target-image, --target-direction or --target-feature (commands.target_options) follows an
        # embedding target instead of a class: a model without a classifier head can run it.
        has_embedding_target = getattr(job, "embedding_target", None) is not None
        for use in job.uses():
            require_support(use, architecture, has_embedding_target)
        planned.append(job.plan(architecture))
    return planned


# Commands written for one token grid through every block (timm's VisionTransformer forward): Swin's stages refuse
# them until they read the model through the capture layer. anatomy's filters view reads only the patch embedding.
ONE_GRID_COMMANDS = frozenset(("patches", "trace", "lens", "attribute", "patch", "anatomy"))


def job_needs_one_grid(job: Job) -> bool:
    return job.command in ONE_GRID_COMMANDS and getattr(job, "view", None) != "filters"


def _shell_word(argument: str) -> str:
    """One argument as the shell reads it back. One with bytes that are not UTF-8 (a Latin-1 file name) in bash's
    `$'...'` quoting, whose `\\xHH` and `\\\\` are exactly vitcli's file name escapes (vitcli.filenames)."""
    from vitcli.filenames import escaped_path

    if not any("\udc80" <= character <= "\udcff" for character in argument):
        return shlex.quote(argument)
    return "$'" + escaped_path(argument).replace("'", "\\'") + "'"
