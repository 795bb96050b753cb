"""`vitcli lens` as a library: its Job (settings, checks, name, computation, presentation) and the builder
that the command, `vitcli run` configs and the Python API call."""

from __future__ import annotations

from typing import Any

from vitcli.jobs import ImageWork, Job, Presentation, builds_jobs
from vitcli.jobs.following import TargetOption
from vitcli.naming import result_name, setting
from vitcli.target_class import resolve_target_text


class LensJob(Job):
    command = "lens"

    def __init__(self, target: str | None):
        self.target_text = target
        self.target: int | None = None  # resolved by check()

    def check(self, architecture: Any) -> None:
        self.target = resolve_target_text(architecture, self.target_text)

    def name(self) -> str:
        return result_name("lens", setting("t", "top1" if self.target is None else self.target))

    def settings(self) -> dict[str, Any]:
        return {"target": self.target}

    def compute(self, work: ImageWork) -> Any:
        from vitcli.experiments.lens import logit_lens

        return logit_lens(work.model, work.image, None if self.target is None else str(self.target))

    def present(self, result: Any) -> Presentation:
        from vitcli.presentation import lens as view

        return Presentation.of(view, result)


@builds_jobs("lens")
def lens_jobs(target: TargetOption = None) -> list[Job]:
    return [LensJob(target)]
