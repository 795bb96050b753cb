"""Top-k classes of one image from its clean forward (which the runner batches across images)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor

from vitcli.experiments.results import ClassScore, top_classes
from vitcli.images import ImageSource

if TYPE_CHECKING:
    from vitcli.zero_shot import ZeroShot


@dataclass
class Prediction:
    source: ImageSource
    top: list[ClassScore]
    weights: str
    probabilities: str = "softmax"  # "softmax" over all classes, or "sigmoid" per class (SigLIP's zero-shot labels)
    zero_shot: dict[str, Any] | None = None  # a zero-shot classifier's labels, templates and definition


def predict(
    logits: Tensor,
    labels: list[str],
    source: ImageSource,
    weights: str,
    top_k: int,
    zero_shot: ZeroShot | None = None,
) -> Prediction:
    """The top_k classes of one image's (classes,) logits, with probabilities as the model defines them: a softmax
    over all classes, or for a zero-shot classifier its own (CLIP: softmax over the labels; SigLIP: a sigmoid per
    label)."""
    if zero_shot is None:
        return Prediction(source, top_classes(logits, logits.double().softmax(dim=-1), labels, top_k), weights)
    probabilities = zero_shot.probabilities(logits.double())
    top = top_classes(logits, probabilities, labels, top_k)
    return Prediction(source, top, weights, zero_shot.kind, zero_shot.describe())
