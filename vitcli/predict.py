"""Top-k classification of images, batched."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.table import Table

from vitcli.errors import UsageError
from vitcli.images import ImageSource
from vitcli.model import VitModel
from vitcli.render import weights_caption


@dataclass(frozen=True)
class ClassScore:
    rank: int
    index: int
    label: str
    probability: float
    logit: float


@dataclass
class ImagePrediction:
    source: ImageSource
    top: list[ClassScore]
    weights: str

    def table(self) -> Table:
        table = Table(title=f"{self.source.path}  top {len(self.top)}", caption=weights_caption(self.weights))
        for column in ("rank", "class", "label", "probability", "logit"):
            table.add_column(column, justify="left" if column == "label" else "right")
        for score in self.top:
            table.add_row(
                str(score.rank), str(score.index), score.label, f"{score.probability:.6f}", f"{score.logit:.4f}"
            )
        return table

    def rows(self) -> list[dict[str, Any]]:
        return [
            {
                "image": str(self.source.path),
                "rank": score.rank,
                "class_index": score.index,
                "label": score.label,
                "probability": score.probability,
                "logit": score.logit,
                "weights": self.weights,
            }
            for score in self.top
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "image": self.source.to_json(),
            "weights": self.weights,
            "top": [
                {
                    "rank": score.rank,
                    "class_index": score.index,
                    "label": score.label,
                    "probability": score.probability,
                    "logit": score.logit,
                }
                for score in self.top
            ],
        }


def predict(model: VitModel, paths: list[Path], top_k: int = 5) -> list[ImagePrediction]:
    """Top-k classes of each image; images are decoded and run batch_size at a time."""
    if not 1 <= top_k <= model.num_classes:
        raise UsageError(f"--top-k must be between 1 and {model.num_classes} (the model's classes), not {top_k}")
    predictions = []
    for start in range(0, len(paths), model.batch_size):
        prepared = [model.prepare(path) for path in paths[start : start + model.batch_size]]
        logits = model.logits(torch.stack([image.input for image in prepared]))
        probabilities = logits.softmax(dim=-1)
        best = probabilities.topk(top_k, dim=-1)
        for row, image in enumerate(prepared):
            top = [
                ClassScore(rank + 1, index, model.labels[index], float(probabilities[row, index]), float(logits[row, index]))
                for rank, index in enumerate(best.indices[row].tolist())
            ]
            predictions.append(ImagePrediction(image.source, top, model.spec.label))
    return predictions
