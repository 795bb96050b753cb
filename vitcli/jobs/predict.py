"""`vitcli predict` as a library: its Job (settings, plan, name, computation, presentation) and the builder
that the command, `vitcli run` configs and the Python API call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import typer

from vitcli.jobs import ImageWork, Job, Presentation, builds_jobs
from vitcli.naming import result_name, setting
from vitcli.spec import fitted_count

DEFAULT_TOP_K = 5


@dataclass(frozen=True)
class PredictPlan:
    top_k: int  # --top-k, or its default fitted to the model's classes


class PredictJob(Job):
    command = "predict"

    def __init__(self, top_k: int | None = None, planned: PredictPlan | None = None):
        self.top_k = top_k  # None: DEFAULT_TOP_K, or the model's classes when fewer
        self._planned = planned

    def name(self) -> str:
        return result_name("predict", setting("k", self.planned.top_k))

    def settings(self) -> dict[str, Any]:
        return {"top_k": self.planned.top_k}

    def plan(self, architecture: Any) -> PredictJob:
        top_k = fitted_count("--top-k", self.top_k, DEFAULT_TOP_K, architecture.num_classes, "the model's classes")
        return PredictJob(self.top_k, PredictPlan(top_k))

    def compute(self, work: ImageWork) -> Any:
        from vitcli.experiments.predict import predict

        model = work.model
        logits = work.clean_logits()
        return predict(logits, model.labels, work.image.source, model.spec.label, self.planned.top_k, model.zero_shot)

    def present(self, result: Any) -> Presentation:
        from vitcli.presentation import predict as view

        return Presentation.of(view, result)


@builds_jobs("predict")
def predict_jobs(
    top_k: Annotated[
        int | None,
        typer.Option(
            "--top-k",
            "-k",
            help=f"How many classes to list per image (default {DEFAULT_TOP_K}, or the model's classes if fewer).",
            show_default=False,
        ),
    ] = None,
) -> list[Job]:
    return [PredictJob(top_k)]
