"""`vitcli occlude-quadrants` and `occlude-patches` as a library: their Jobs (settings, plan, name, computation,
presentation) and the builders that the commands, `vitcli run` configs and the Python API call."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

import typer

from vitcli.errors import UsageError
from vitcli.jobs import ImageWork, Job, Presentation, builds_jobs
from vitcli.jobs.following import FollowsEmbedding, TargetOption, TargetPlan, follows_embedding_target
from vitcli.naming import result_name, setting
from vitcli.targets import EmbeddingTarget


class Fill(StrEnum):
    gray = "gray"
    black = "black"
    white = "white"
    mean = "mean"
    blur = "blur"


FillOption = Annotated[
    Fill,
    typer.Option(
        help="What covered pixels become: gray = the checkpoint's mean (normalized 0), black, white, "
        "mean = this image's mean colour, blur = a Gaussian-blurred copy (sigma half a patch)."
    ),
]


class OcclusionJob(FollowsEmbedding, Job):
    """Covers over one image and the fall of the target probability; the target is resolved by plan()."""

    command = "occlude-quadrants"

    def __init__(
        self,
        target: str | None,
        fill: Fill,
        embedding: EmbeddingTarget | None = None,
        planned: TargetPlan | PatchOcclusionPlan | None = None,
    ):
        self.embedding_target = embedding
        self.target_text = target
        self.fill = fill
        self._planned = planned

    def plan(self, architecture: Any) -> OcclusionJob:
        return OcclusionJob(self.target_text, self.fill, self.embedding_target, self._target_plan(architecture))

    def _target_plan(self, architecture: Any) -> TargetPlan:
        from vitcli.target_class import resolve_target_text

        if self.embedding_target is not None:
            self.embedding_target.check(architecture)
        return TargetPlan(resolve_target_text(architecture, self.target_text))

    def target_argument(self, work: ImageWork) -> Any:
        """What the experiment follows: the embedding target on this model, the class index, or None (top-1)."""
        if self.embedding_target is not None:
            return self.bound_target(work.model)
        target = self.planned.target
        return None if target is None else str(target)

    def clean_logits(self, work: ImageWork) -> Any:
        return None if self.embedding_target is not None else work.clean_logits()

    def name(self) -> str:
        return result_name("occlusion-quadrants", self.fill.value, self.target_name_part())

    def settings(self) -> dict[str, Any]:
        target = "top1" if self.planned.target is None else self.planned.target
        return {"fill": self.fill.value, "target": target, **self.embedding_settings()}

    def compute(self, work: ImageWork) -> Any:
        from vitcli.experiments.occlusion import occlude_quadrants

        return occlude_quadrants(
            work.model, work.image, self.target_argument(work), self.fill.value, clean_logits=self.clean_logits(work)
        )

    def present(self, result: Any) -> Presentation:
        from vitcli.presentation import occlusion as view

        return Presentation.of(view, result)


@dataclass(frozen=True)
class PatchOcclusionPlan:
    """The target and the covers laid on the model's grid (PatchOcclusionJob.plan)."""

    target: int | None  # None: each image's clean top-1
    windows: Any  # experiments.occlusion.SlidingWindows


class PatchOcclusionJob(OcclusionJob):
    """Square covers slid over the input; the windows are laid on the grid by plan()."""

    command = "occlude-patches"

    def __init__(
        self,
        target: str | None,
        fill: Fill,
        size: int | None,
        stride: int | None,
        embedding: EmbeddingTarget | None = None,
        planned: PatchOcclusionPlan | None = None,
    ):
        super().__init__(target, fill, embedding, planned)
        self.size, self.stride = size, stride

    def plan(self, architecture: Any) -> PatchOcclusionJob:
        from vitcli.experiments.occlusion import SlidingWindows

        target = self._target_plan(architecture).target
        grid = architecture.map_grid  # Swin: one cover per token of the last stage (7x7 of 32 pixels)
        size = self.size if self.size is not None else grid.patch_size
        windows = SlidingWindows(grid, size, self.stride if self.stride is not None else size)
        planned = PatchOcclusionPlan(target, windows)
        return PatchOcclusionJob(self.target_text, self.fill, self.size, self.stride, self.embedding_target, planned)

    def name(self) -> str:
        windows = self.planned.windows
        return result_name(
            "occlusion-patches",
            setting("s", windows.size),
            setting("st", windows.stride),
            self.fill.value,
            self.target_name_part(),
        )

    def settings(self) -> dict[str, Any]:
        windows = self.planned.windows
        return {**super().settings(), "size": windows.size, "stride": windows.stride}

    def compute(self, work: ImageWork) -> Any:
        from vitcli.experiments.occlusion import occlude_patches

        windows = self.planned.windows
        work.steps.start(len(windows), f"occluding {work.image.source.display_name}")
        return occlude_patches(
            work.model,
            work.image,
            windows,
            self.target_argument(work),
            self.fill.value,
            on_batch=work.steps.advance,
            clean_logits=self.clean_logits(work),
        )

    def present(self, result: Any) -> Presentation:
        from vitcli.presentation import occlusion as view

        presentation = super().present(result)
        presentation.extra_files = {"grid.csv": view.drop_grid_text(result)}
        return presentation


def _fill(fill: Fill | str) -> Fill:
    fills = [choice.value for choice in Fill]
    if fill not in fills:
        raise UsageError(f"--fill must be one of {', '.join(fills)}, not {fill}")
    return Fill(fill)


@builds_jobs("occlude-quadrants")
@follows_embedding_target
def occlude_quadrants_jobs(
    target: TargetOption = None,
    fill: FillOption = Fill.gray,
    *,
    embedding: EmbeddingTarget | None = None,
) -> list[Job]:
    return [OcclusionJob(target, _fill(fill), embedding)]


@builds_jobs("occlude-patches")
@follows_embedding_target
def occlude_patches_jobs(
    target: TargetOption = None,
    fill: FillOption = Fill.gray,
    size: Annotated[
        int | None, typer.Option(help="Cover side in pixels (default: the patch size).", show_default=False)
    ] = None,
    stride: Annotated[
        int | None, typer.Option(help="Step between covers in pixels (default: the cover size).", show_default=False)
    ] = None,
    *,
    embedding: EmbeddingTarget | None = None,
) -> list[Job]:
    return [PatchOcclusionJob(target, _fill(fill), size, stride, embedding)]
