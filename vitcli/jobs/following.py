"""What a job follows: a target in embedding space (vitcli.targets), bound to the loaded model once, or classes,
given as text and resolved by vitcli.target_class into the job's TargetPlan when it is planned."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vitcli.naming import setting
from vitcli.targets import EmbeddingTarget

if TYPE_CHECKING:
    from vitcli.model import VitModel
    from vitcli.targets import BoundTarget


@dataclass(frozen=True)
class TargetPlan:
    """The classes a job follows, resolved against the model's labels by its plan()."""

    target: int | None  # None: each image's clean top-1
    contrast: int | None = None


class FollowsEmbedding:
    """A job's embedding target, bound to the loaded model on first use (REF's embedding computed once)."""

    embedding_target: EmbeddingTarget | None = None
    planned: Any  # the job's plan (Job.plan), whose `target` is the class followed otherwise (None: the clean top-1)
    _bound: tuple[int, BoundTarget] | None = None

    def bound_target(self, model: VitModel) -> BoundTarget | None:
        from vitcli.targets import bind

        if self.embedding_target is None:
            return None
        if self._bound is None or self._bound[0] != id(model):
            self._bound = (id(model), bind(self.embedding_target, model))
        return self._bound[1]

    def target_name_part(self) -> str | None:
        """The result name's part for what the job follows: the embedding target's, else t<class> (ttop1)."""
        if self.embedding_target is not None:
            return self.embedding_target.name_part
        target = self.planned.target
        return setting("t", "top1" if target is None else target)

    def embedding_settings(self) -> dict[str, Any]:
        """The target as JSON; once bound, with what the loaded model tells (a text target's scale)."""
        if self.embedding_target is None:
            return {}
        target = self.embedding_target if self._bound is None else self._bound[1].target
        return {"target": target.describe()}
