"""Top-k classes as a table, CSV rows, JSON and a summary."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from vitcli.experiments.predict import ClassScore, Prediction
from vitcli.render import weights_caption


def table(result: Prediction) -> Table:
    return top_table(result.top, f"{result.source.path}  top {len(result.top)}", weights_caption(result.weights))


def top_table(scores: list[ClassScore], title: str, caption: str | None = None) -> Table:
    """Ranked classes with their probability and logit (predict's table; trace shows its top classes the same way)."""
    top = Table(title=title, caption=caption)
    for column in ("rank", "class", "label", "probability", "logit"):
        top.add_column(column, justify="left" if column == "label" else "right")
    for score in scores:
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
