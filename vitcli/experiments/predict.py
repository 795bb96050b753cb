"""Top-k classes of one image from its clean forward (which the runner batches across images)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from vitcli.images import ImageSource


@dataclass(frozen=True)
class ClassScore:
    rank: int
    index: int
    label: str
    probability: float
    logit: float


@dataclass
class Prediction:
    source: ImageSource
    top: list[ClassScore]
    weights: str


def predict(logits: Tensor, labels: list[str], source: ImageSource, weights: str, top_k: int) -> Prediction:
    """The top_k classes of one image's (classes,) logits, with softmax probabilities over all classes."""
    return Prediction(source, top_classes(logits, logits.double().softmax(dim=-1), labels, top_k), weights)


def top_classes(logits: Tensor, probabilities: Tensor, labels: list[str], top_k: int) -> list[ClassScore]:
    """The top_k classes by probability, ranked from 1, each with its label, probability and logit."""
    best = probabilities.topk(min(top_k, probabilities.numel()))
    return [
        ClassScore(rank + 1, index, labels[index], float(probabilities[index]), float(logits[index]))
        for rank, index in enumerate(best.indices.tolist())
    ]
