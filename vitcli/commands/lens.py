from __future__ import annotations

from typing import Any

from vitcli.commands.explain import resolve_target_text
from vitcli.commands.occlude import TargetOption
from vitcli.context import CommandContext
from vitcli.jobs import ImageWork, Job, Presentation, builds_jobs
from vitcli.naming import result_name, setting
from vitcli.options import ImagesArgument
from vitcli.shell import vitcli_command


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
def lens_jobs(target: str | None = None) -> list[Job]:
    return [LensJob(target)]


@vitcli_command(
    "lens",
    examples=[
        "vitcli lens examples/images/newfoundland_31.jpg",
        "vitcli lens photos/ --target Newfoundland --format csv",
    ],
)
def lens_command(context: CommandContext, images: ImagesArgument = None, target: TargetOption = None) -> None:
    """Logit lens: the model's final norm and head read the CLS row (and the mean of the patch rows) after every
    block; the target's probability and rank and the top-1 per block, checked to equal the logits at the last."""
    context.run(lens_jobs(target), images)
