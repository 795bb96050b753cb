"""`vitcli lens` as a library: its Job (settings, plan, name, computation, presentation) and the builder
that the command, `vitcli run` configs and the Python API call."""

from __future__ import annotations

from typing import Any

from vitcli.jobs import ImageWork, Job, Presentation, builds_jobs
from vitcli.jobs.following import TargetOption, TargetPlan
from vitcli.naming import result_name, setting
from vitcli.target_class import resolve_target_text


class LensJob(Job):
    command = "lens"

    def __init__(self, target: str | None, planned: TargetPlan | None = None):
        self.target_text = target
        self._planned = planned

    def plan(self, architecture: Any) -> LensJob:
        return LensJob(self.target_text, TargetPlan(resolve_target_text(architecture, self.target_text)))

    def name(self) -> str:
        target = self.planned.target
        return result_name("lens", setting("t", "top1" if target is None else target))

    def settings(self) -> dict[str, Any]:
        return {"target": self.planned.target}

    def compute(self, work: ImageWork) -> Any:
        from vitcli.experiments.lens import logit_lens

        target = self.planned.target
        return logit_lens(work.model, work.image, None if target is None else str(target))

    def present(self, result: Any) -> Presentation:
        from vitcli.presentation import lens as view

        return Presentation.of(view, result)


@builds_jobs("lens")
def lens_jobs(target: TargetOption = None) -> list[Job]:
    return [LensJob(target)]
