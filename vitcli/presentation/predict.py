"""Top-k classes as a table, CSV rows, JSON, a figure and a summary."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from vitcli.experiments.predict import Prediction
from vitcli.experiments.results import ClassScore
from vitcli.render import weights_caption


def table(result: Prediction) -> Table:
    title = f"{result.source.display_path}  top {len(result.top)}"
    if result.zero_shot is not None:
        title += f"  (zero-shot: {_meaning(result)})"
    return top_table(result.top, title, weights_caption(result.weights))


def _meaning(result: Prediction) -> str:
    """What the probabilities are: a softmax over all classes, or a sigmoid per label."""
    if result.probabilities == "sigmoid":
        return "sigmoid per label"
    return "softmax over the labels" if result.zero_shot is not None else "softmax over all classes"


def top_table(scores: list[ClassScore], title: str, caption: str | Text | None = None) -> Table:
    """Ranked classes with their probability and logit (predict's table; trace shows its top classes the same way)."""
    top = Table(title=title, caption=caption)
    for column in ("rank", "class", "label", "probability", "logit"):
        top.add_column(column, justify="left" if column == "label" else "right")
    for score in scores:
        label = Text(score.label)  # a user's text, never rich markup ("[red]" stays "[red]")
        top.add_row(str(score.rank), str(score.index), label, f"{score.probability:.6f}", f"{score.logit:.4f}")
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
    zero_shot = {} if result.zero_shot is None else {"zero_shot": result.zero_shot}
    return {"weights": result.weights, "probabilities": result.probabilities, **zero_shot, "top": rows(result)}


def figure(result: Prediction) -> Any:
    """The top-k probabilities as horizontal bars, the top-1 first, each labelled with class index and name."""
    from vitcli import figures

    scores = result.top
    fig, axes = figures.plt.subplots(figsize=(7.0, 0.42 * len(scores) + 1.6), layout="constrained")
    names = [f"{score.index} {_short(score.label)}" for score in scores]
    positions = range(len(scores))
    axes.barh(positions, [score.probability for score in scores], color="tab:blue")
    axes.set_yticks(positions, names, fontsize=9, parse_math=False)  # class labels, as written
    axes.invert_yaxis()
    top = max(score.probability for score in scores)
    axes.set_xlim(0, min(1.0, top * 1.25) or 1.0)
    for position, score in zip(positions, scores, strict=True):
        axes.text(score.probability, position, f" {score.probability:.4f}", va="center", fontsize=8)
    axes.set_xlabel(f"probability ({_meaning(result)})")
    figures.title(fig, f"{result.source.display_name}: top {len(scores)} classes", result.weights)
    return fig


def _short(label: str, width: int = 32) -> str:
    """A label's first name (ImageNet's list several, comma-separated), cut to fit beside a bar."""
    first = label.split(",")[0]
    return first if len(first) <= width else first[: width - 1] + "…"


def summary(result: Prediction) -> dict[str, Any]:
    best = result.top[0]
    return {
        "predict_top1_class": best.index,
        "predict_top1_label": best.label,
        "predict_top1_probability": best.probability,
    }
