"""The result types several experiments share: a class with its probability (what an experiment follows or finds
on top), a ranked class score, an embedding target's score in a class's place, and the top classes of one output."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

    from vitcli.targets import EmbeddingTarget


@dataclass(frozen=True)
class ClassProbability:
    """A class with its probability on the clean image: the target an experiment follows, or the top-1."""

    index: int
    label: str
    probability: float


def class_probability(labels: Sequence[str], index: int, probabilities: Tensor) -> ClassProbability:
    """Class `index` with its probability among `probabilities` (classes,)."""
    return ClassProbability(index, labels[index], float(probabilities[index]))


@dataclass(frozen=True)
class EmbeddingScore:
    """An embedding target with its score on the clean image: what results show in place of a class."""

    target: EmbeddingTarget
    score: float

    @property
    def kind(self) -> str:
        return self.target.kind

    @property
    def label(self) -> str:
        return self.target.short

    def to_json(self) -> dict[str, Any]:
        return {**self.target.describe(), "clean_score": self.score}


@dataclass(frozen=True)
class ClassScore:
    rank: int
    index: int
    label: str
    probability: float
    logit: float


def top_classes(logits: Tensor, probabilities: Tensor, labels: list[str], top_k: int) -> list[ClassScore]:
    """The top_k classes by probability, ranked from 1, each with its label, probability and logit."""
    best = probabilities.topk(min(top_k, probabilities.numel()))
    return [
        ClassScore(rank + 1, index, labels[index], float(probabilities[index]), float(logits[index]))
        for rank, index in enumerate(best.indices.tolist())
    ]
