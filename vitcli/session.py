"""One session: a loaded model and a publisher, running Jobs of every scope over a list of images.

The command line (`CommandContext.run`), `vitcli run` (vitcli.batch.execute) and the Python API (vitcli.api) all
run their Jobs through `Session.run`: the jobs about the model alone once, the per-image jobs on every image (each
chunk's clean forward run once, batched, and shared), the results that sum up the images' results, then the jobs
about the images together. Every result is presented and published through the publisher's store.

A session on an `UnloadedModel` (the model's spec, device and batch size, and no weights) runs the jobs about the
model that need no weights: compare-patch-size's counts, which the command computes without loading any.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitcli.jobs import Job
from vitcli.publisher import Publisher
from vitcli.runner import Failure, Published, Report, Runner

if TYPE_CHECKING:
    from vitcli.model import VitModel
    from vitcli.spec import WeightsSpec


@dataclass(frozen=True)
class UnloadedModel:
    """What a job that needs no weights reads of the model (`Job.needs_weights` False): the spec (name, seed), the
    device and the batch size, resolved as `loading.load_model` resolves them (`CommandContext.unloaded_model`)."""

    spec: WeightsSpec
    device: Any  # torch.device
    batch_size: int


class Session:
    """Runs Jobs on one model and publishes their results through one publisher.

    `reraise`: a failure is raised as it came instead of being reported and passed over, for a caller that reports
    the error itself (one call of the Python API; a command about one set of images). `skip(subject, name, image)`
    says whether a result is already complete (a resumed `vitcli run`)."""

    def __init__(
        self,
        model: VitModel | UnloadedModel,
        publisher: Publisher,
        fail_fast: bool = False,
        skip: Callable[[str, str, Path | None], bool] | None = None,
        reraise: bool = False,
    ):
        self.model = model
        self.publisher = publisher
        self.runner = Runner(model, publisher, fail_fast, skip)
        self.runner.reraise = reraise

    def on_published(self, callback: Callable[[Published], None]) -> None:
        """Call `callback` with each result once its files are in place."""
        self.runner.on_published = callback

    def on_failure(self, callback: Callable[[Failure], None]) -> None:
        self.runner.on_failure = callback

    def run(
        self, jobs: Sequence[Job], paths: Sequence[Path], report: Report, progress: Any = None, steps: Any = None
    ) -> Report:
        """Every job over `paths`, by scope: the model alone, each image, then the images together (whose inner
        steps show on `progress`, or as `steps` says when given)."""
        if isinstance(self.model, UnloadedModel):
            for job in jobs:
                if job.needs_weights or job.scope != "model":
                    raise ValueError(f"{job.command} needs the model's weights: this session has loaded none")
        by_scope: dict[str, list[Job]] = {"model": [], "image": [], "set": []}
        for job in jobs:
            by_scope[job.scope].append(job)
        self.runner.keeps_prepared = any(job.holds_every_image for job in by_scope["set"])
        self.runner.run_once(by_scope["model"], report)
        if paths:  # counts the images even with no per-image job (a run's report says "N of M images done")
            self.runner.run(by_scope["image"], paths, report, progress if by_scope["image"] else None)
            self.runner.publish_across_images(paths, report)
        self.runner.run_over_set(by_scope["set"], paths, report, progress, steps)
        return report
