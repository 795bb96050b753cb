"""Top-k classes as a table, CSV rows, JSON and a summary."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from vitcli.experiments.predict import Prediction
from vitcli.render import weights_caption


def table(result: Prediction) -> Table:
    top = Table(title=f"{result.source.path}  top {len(result.top)}", caption=weights_caption(result.weights))
    for column in ("rank", "class", "label", "probability", "logit"):
        top.add_column(column, justify="left" if column == "label" else "right")
    for score in result.top:
        top.add_row(str(score.rank), str(score.index), score.label, f"{score.probability:.6f}", f"{score.logit:.4f}")
    return top


def rows(result: Prediction) -> list[dict[str, Any]]:
    return [
        {
            "rank": score.rank,
            "class_index": score.index,
            "label": score.label,
            "probability": score.probability,
            "logit": score.logit,
        }
        for score in result.top
    ]


def document(result: Prediction) -> dict[str, Any]:
    return {"weights": result.weights, "top": rows(result)}


def summary(result: Prediction) -> dict[str, Any]:
    best = result.top[0]
    return {
        "predict_top1_class": best.index,
        "predict_top1_label": best.label,
        "predict_top1_probability": best.probability,
    }
