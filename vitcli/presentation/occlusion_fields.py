"""The pieces every view of an occlusion result shares: the clean image's facts, one cover's outcome as fields, and
how a score, a drop and a box read as text (vitcli.presentation.occlusion builds tables, rows, documents, summaries
and figures from them)."""

from __future__ import annotations

from typing import Any

from vitcli.experiments.covers import Cover
from vitcli.experiments.occlusion import Baseline, CoverOutcome
from vitcli.experiments.results import ClassProbability, EmbeddingScore


def baseline_json(base: Baseline) -> dict[str, Any]:
    if isinstance(base.target, EmbeddingScore):
        return {"weights": base.weights, "fill": base.fill, "target": base.target.to_json(), "clean_top1": None}
    return {
        "weights": base.weights,
        "fill": base.fill,
        "target": {
            "kind": "class",
            "class_index": base.target.index,
            "label": base.target.label,
            "clean_probability": base.target.probability,
        },
        "clean_top1": {"class_index": base.top1.index, "label": base.top1.label, "probability": base.top1.probability},
    }


def row_prefix(base: Baseline) -> dict[str, Any]:
    if isinstance(base.target, EmbeddingScore):
        return {"target_kind": base.target.kind, "target_label": base.target.label, "clean_score": base.target.score}
    return {
        "target_class": base.target.index,
        "target_label": base.target.label,
        "clean_probability": base.target.probability,
    }


def outcome_fields(outcome: CoverOutcome, base: Baseline) -> dict[str, Any]:
    left, top, right, bottom = outcome.cover.box
    if isinstance(base.target, EmbeddingScore):  # no class is read: the forward ends at the embedding
        return {
            "cover": outcome.cover.name,
            "patch": f"P{outcome.cover.patch}" if outcome.cover.patch else "",
            "row": outcome.cover.row,
            "col": outcome.cover.col,
            "left": left,
            "top": top,
            "right": right,
            "bottom": bottom,
            "target_score": outcome.target_probability,
            "drop": outcome.drop,
        }
    return {
        "cover": outcome.cover.name,
        "patch": f"P{outcome.cover.patch}" if outcome.cover.patch else "",
        "row": outcome.cover.row,
        "col": outcome.cover.col,
        "left": left,
        "top": top,
        "right": right,
        "bottom": bottom,
        "target_probability": outcome.target_probability,
        "drop_points": outcome.drop,
        "top1_class": outcome.top1.index,
        "top1_label": outcome.top1.label,
        "top1_probability": outcome.top1.probability,
        "top1_changed": outcome.top1_changed,
    }


def first_name(score: ClassProbability) -> str:
    return score.label.split(",")[0]


def short(score: ClassProbability | EmbeddingScore) -> str:
    if isinstance(score, EmbeddingScore):
        return f"{score.label} ({score.target.unit} {score.score:.4f})"
    return f"{score.index} {first_name(score)} ({score.probability:.4f})"


def measure(score: ClassProbability | EmbeddingScore) -> str:
    """What the covers move, in words: the class's probability or the embedding target's score."""
    if isinstance(score, EmbeddingScore):
        return f"{score.target.unit}, {score.label}"
    return f"probability of {score.index} {first_name(score)}"


def value_heads(base: Baseline) -> tuple[str, str]:
    """The table's column heads of the covered value and of the drop."""
    return ("target score", "drop") if isinstance(base.target, EmbeddingScore) else ("target p", "drop (pts)")


def drop_unit(base: Baseline) -> str:
    if isinstance(base.target, EmbeddingScore):
        return f"{base.target.target.unit}: clean - covered score"
    return "percentage points: 100 x (clean - covered probability)"


def top1_note(base: Baseline) -> str:
    return "" if base.top1 is None else "; * = top-1 changed"


def target_cell(score: ClassProbability | EmbeddingScore) -> int | str:
    return score.label if isinstance(score, EmbeddingScore) else score.index


def clean_value(score: ClassProbability | EmbeddingScore) -> float:
    return score.score if isinstance(score, EmbeddingScore) else score.probability


def box_text(box: tuple[int, int, int, int]) -> str:
    return ",".join(str(value) for value in box)


def top1_after(outcome: CoverOutcome) -> str:
    if outcome.top1 is None:
        return ""
    return f"{outcome.top1.index} {first_name(outcome.top1)}" + ("*" if outcome.top1_changed else "")


def points(drop: float) -> str:
    return f"{drop:+.4g}"


def where(cover: Cover) -> str:
    return f"{cover.name} (row {cover.row}, col {cover.col}; box {box_text(cover.box)})"
