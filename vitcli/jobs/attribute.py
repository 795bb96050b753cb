"""`vitcli attribute` as a library: its Job (settings, plan, name, computation, presentation) and the builder
that the command, `vitcli run` configs and the Python API call."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import typer

from vitcli.errors import UsageError, VitcliError
from vitcli.jobs import ImageWork, Job, Presentation, builds_jobs
from vitcli.jobs.following import FollowsEmbedding, TargetOption, TargetPlan, follows_embedding_target
from vitcli.naming import result_name, setting
from vitcli.target_class import resolve_contrast, resolve_target_text, target_or_top1
from vitcli.targets import EmbeddingTarget


class By(StrEnum):
    block = "block"
    head = "head"
    token = "token"


ContrastOption = Annotated[
    str | None,
    typer.Option(
        "--contrast",
        help="A second class: attribute the logit difference target - contrast (an index or a label).",
        show_default=False,
    ),
]


class AttributeJob(FollowsEmbedding, Job):
    command = "attribute"

    def __init__(
        self,
        target: str | None,
        contrast: str | None,
        by: str,
        block: int | None,
        embedding: EmbeddingTarget | None = None,
        planned: TargetPlan | None = None,
    ):
        self.embedding_target = embedding
        self.target_text = target
        self.contrast_text = contrast
        self.by = by
        self.block = block
        self._planned = planned

    def plan(self, architecture: Any) -> AttributeJob:
        from vitcli.capture import family_of
        from vitcli.experiments.readout import readout_refusal
        from vitcli.loading import require_pre_norm

        skeleton = require_pre_norm(architecture.name)
        # A zero-shot head (no linear_head) is installed after loading and always readable: check the net's own head
        linear_head = "linear_head" in architecture.features
        refusal = readout_refusal(skeleton, architecture.name, head=self.embedding_target is None and linear_head)
        if refusal is not None:
            raise UsageError(refusal)
        if "heads" not in family_of(skeleton).features:  # EVA-02 with a sub-norm between its heads and attn.proj
            raise UsageError(
                f"{architecture.name}'s attention normalizes its heads together before attn.proj, so its output is "
                "not a sum over heads; attribute splits it by head"
            )
        if self.block is not None:
            if not 1 <= self.block <= architecture.depth:
                raise UsageError(
                    f"--block must be between 1 and {architecture.depth} (the model's blocks), not {self.block}"
                )
            attention = getattr(skeleton.blocks[self.block - 1], "attn", None)  # transformers' blocks: none
            norm = getattr(attention, "norm", None)  # Beit's attention has none, nor transformers' ViTs
            if type(norm).__name__ not in ("Identity", "NoneType") or getattr(attention, "gate", None) is not None:
                raise UsageError(
                    f"--by token: {architecture.name}'s attention normalizes or gates the heads before attn.proj, "
                    "so a head's output is not a sum over source tokens"
                )
        if self.embedding_target is not None:
            self.embedding_target.check(architecture)
        target = resolve_target_text(architecture, self.target_text)
        planned = TargetPlan(target, resolve_contrast(architecture.labels, self.contrast_text, target))
        return AttributeJob(self.target_text, self.contrast_text, self.by, self.block, self.embedding_target, planned)

    def uses(self) -> tuple[str, ...]:
        return ("attribute",) if self.by == "block" else (f"attribute --by {self.by}",)

    def name(self) -> str:
        return result_name(
            "attribute",
            self.by,
            setting("b", self.block),
            self.target_name_part(),
            setting("c", self.planned.contrast),
        )

    def settings(self) -> dict[str, Any]:
        return {
            "target": self.planned.target,
            "contrast": self.planned.contrast,
            "by": self.by,
            "block": self.block,
            **self.embedding_settings(),
        }

    def compute(self, work: ImageWork) -> Any:
        from vitcli.experiments.attribution import attribute

        if self.embedding_target is not None:
            embedding = self.bound_target(work.model)
            return attribute(work.model, work.image, None, None, self.by, self.block, embedding)
        contrast = self.planned.contrast
        target = target_or_top1(self.planned.target, work.clean_logits())
        if target == contrast:
            raise VitcliError(
                f"--contrast {contrast} is this image's top-1, the default target: give --target or another class"
            )
        return attribute(work.model, work.image, target, contrast, self.by, self.block)

    def present(self, result: Any) -> Presentation:
        from vitcli.presentation import attribution as view

        return Presentation.of(view, result)


@builds_jobs("attribute")
@follows_embedding_target
def attribute_jobs(
    target: TargetOption = None,
    contrast: ContrastOption = None,
    by: Annotated[
        By,
        typer.Option(
            help="block: the embedding and each block's attention and MLP; head: every head (and each block's "
            "attention bias); token: each source token through each head of --block."
        ),
    ] = By.block,
    block: Annotated[
        int | None,
        typer.Option(help="The block (from 1) of --by token.", show_default=False),
    ] = None,
    *,
    embedding: EmbeddingTarget | None = None,
) -> list[Job]:
    by = str(by)
    if by not in {member.value for member in By}:
        raise UsageError(f"unknown --by {by!r}: choose one of {', '.join(member.value for member in By)}")
    if by == By.token and block is None:
        raise UsageError("--by token needs --block B: the block whose heads' source tokens are mapped")
    if by != By.token and block is not None:
        raise UsageError("--block picks the block of --by token; add --by token")
    return [AttributeJob(target, contrast, by, block, embedding)]
