"""Ablations as a table, CSV rows, JSON, heat maps (blocks x heads, blocks x sublayers; centred on 0) and a summary;
the same for the across-images spread."""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.table import Table
from rich.text import Text

from vitcli.experiments.ablation import HEAD, AblationResult, AblationSpreads
from vitcli.experiments.results import EmbeddingScore
from vitcli.render import weights_caption

SUBLAYERS = ("attn", "mlp")
_LABEL_BOX = {"facecolor": "white", "alpha": 0.6, "pad": 0.5, "linewidth": 0}  # readable on any cell colour


def _definition(mode: str, reference: str) -> str:
    replaced = {"zero": "0", "mean": "its mean over the reference images, token by token", "resample": reference}
    return (
        "one ablation per row: head B.H = that head's slice of the input of attn.proj, B.attn / B.mlp = what the "
        f"sublayer adds to the residual, replaced by {replaced.get(mode, mode)}; change = ablated - clean"
    )


def _class_text(chosen: Any) -> str:
    if isinstance(chosen, EmbeddingScore):
        return f"{chosen.label} ({chosen.target.unit})"
    return f"{chosen.index} {chosen.label.split(',')[0]}"


def table(result: AblationResult) -> Table:
    if isinstance(result.target, EmbeddingScore):
        return _embedding_table(result)
    view = Table(
        title=(
            f"{result.source.display_path}\nablating for {_class_text(result.target)} "
            f"(clean logit {result.clean_logit:.4g}, "
            f"p {result.target.probability:.4g}; clean top-1 {_class_text(result.clean_top1)})"
        ),
        caption=Text.assemble(_definition(result.mode, result.reference), "\n", weights_caption(result.weights_label)),
    )
    for column in ("ablated", "logit change", "target p", "p change", "top-1", "changed"):
        view.add_column(column, justify="left" if column == "top-1" else "right")
    for outcome in result.outcomes:
        view.add_row(
            outcome.ablation.label,
            f"{outcome.logit_change:+.4g}",
            f"{outcome.target_probability:.4g}",
            f"{outcome.probability_change:+.4g}",
            f"{_class_text(outcome.top1)} ({outcome.top1.probability:.3g})",
            "yes" if outcome.top1_changed else "",
        )
    return view


def _embedding_table(result: AblationResult) -> Table:
    view = Table(
        title=f"{result.source.display_path}\nablating for {_class_text(result.target)} (clean score "
        f"{result.clean_logit:.4g})",
        caption=Text.assemble(_definition(result.mode, result.reference), "\n", weights_caption(result.weights_label)),
    )
    for column in ("ablated", "score", "score change"):
        view.add_column(column, justify="right")
    for outcome in result.outcomes:
        view.add_row(outcome.ablation.label, f"{outcome.target_logit:.4g}", f"{outcome.logit_change:+.4g}")
    return view


def _site_columns(ablation: Any) -> dict[str, Any]:
    return {
        "ablated": ablation.label,
        "site": ablation.site,
        "block": ablation.block,
        "head": ablation.head,
    }


def rows(result: AblationResult) -> list[dict[str, Any]]:
    if isinstance(result.target, EmbeddingScore):
        return [
            {
                **_site_columns(outcome.ablation),
                "mode": result.mode,
                "target": result.target.label,
                "clean_score": result.clean_logit,
                "ablated_score": outcome.target_logit,
                "score_change": outcome.logit_change,
            }
            for outcome in result.outcomes
        ]
    return [
        {
            **_site_columns(outcome.ablation),
            "mode": result.mode,
            "target_class": result.target.index,
            "clean_logit": result.clean_logit,
            "ablated_logit": outcome.target_logit,
            "logit_change": outcome.logit_change,
            "clean_probability": result.target.probability,
            "ablated_probability": outcome.target_probability,
            "probability_change": outcome.probability_change,
            "top1_class": outcome.top1.index,
            "top1_label": outcome.top1.label,
            "top1_changed": outcome.top1_changed,
        }
        for outcome in result.outcomes
    ]


def document(result: AblationResult) -> dict[str, Any]:
    return {
        "weights": result.weights_label,
        "definition": _definition(result.mode, result.reference),
        "mode": result.mode,
        "reference": result.reference,
        "model": {"blocks": result.depth, "heads": result.num_heads},
        "target": _target_json(result),
        "clean_top1": None
        if result.clean_top1 is None
        else {"class_index": result.clean_top1.index, "label": result.clean_top1.label},
        "ablations": [{key: value for key, value in row.items() if key != "top1_label"} for row in rows(result)],
    }


def _target_json(result: AblationResult) -> dict[str, Any]:
    if isinstance(result.target, EmbeddingScore):
        return result.target.to_json()
    return {
        "kind": "class",
        "class_index": result.target.index,
        "label": result.target.label,
        "clean_logit": result.clean_logit,
        "clean_probability": result.target.probability,
    }


def _maps(ablations: list[Any], values: list[float], depth: int, heads: int) -> tuple[np.ndarray, np.ndarray]:
    """(blocks x heads, blocks x sublayers) maps of values; cells not ablated are NaN."""
    head_map = np.full((depth, heads), np.nan)
    sublayer_map = np.full((depth, len(SUBLAYERS)), np.nan)
    for ablation, value in zip(ablations, values, strict=True):
        if ablation.site == HEAD:
            head_map[ablation.block - 1, ablation.head - 1] = value
        else:
            sublayer_map[ablation.block - 1, SUBLAYERS.index(ablation.site)] = value
    return head_map, sublayer_map


def _heat_figure(
    ablations: list[Any], values: list[float], depth: int, heads: int, what: str, notes: list[str] | None = None
) -> Any:
    """Blocks x heads (and, when sublayers were ablated, blocks x attn/mlp), one colour scale centred on 0; notes,
    when given, are written in the cells."""
    from vitcli import figures

    head_map, sublayer_map = _maps(ablations, values, depth, heads)
    panels_wanted = [(head_map, "head", [str(h) for h in range(1, heads + 1)])]
    if not np.isnan(sublayer_map).all():
        panels_wanted.append((sublayer_map, "sublayer", list(SUBLAYERS)))
    if np.isnan(head_map).all():
        panels_wanted = panels_wanted[1:]
    fig, panels = figures.plt.subplots(
        1, len(panels_wanted), figsize=(3.2 + 2.6 * len(panels_wanted), 5.2), layout="constrained", squeeze=False
    )
    limit = figures.symmetric_limit(values)
    image = None
    for panel, (values_map, label, ticks) in zip(panels[0], panels_wanted, strict=True):
        image = figures.blocks_map(panel, values_map, label, ticks, limit)
    for ablation, note in zip(ablations, notes or [], strict=False):
        panel_index = 0 if ablation.site == HEAD or len(panels_wanted) == 1 else 1
        column = ablation.head - 1 if ablation.site == HEAD else SUBLAYERS.index(ablation.site)
        panels[0][panel_index].text(
            column, ablation.block - 1, note, ha="center", va="center", fontsize=7, bbox=_LABEL_BOX
        )
    fig.colorbar(image, ax=list(panels[0]), shrink=0.85, label=f"{what} (0 = white; gray: not ablated)")
    return fig


def figure(result: AblationResult) -> Any:
    from vitcli import figures

    outcomes = result.outcomes
    fig = _heat_figure(
        [outcome.ablation for outcome in outcomes],
        [outcome.logit_change for outcome in outcomes],
        result.depth,
        result.num_heads,
        "change of the target score" if isinstance(result.target, EmbeddingScore) else "change of the target logit",
    )
    figures.title(
        fig,
        f"{result.source.display_name}: {result.mode}-ablation, target {_class_text(result.target)}",
        result.weights_label,
    )
    return fig


def summary(result: AblationResult) -> dict[str, Any]:
    strongest = min(result.outcomes, key=lambda outcome: outcome.logit_change)
    return {
        "ablate_target_class": result.target.label
        if isinstance(result.target, EmbeddingScore)
        else result.target.index,
        "ablate_largest_drop": strongest.ablation.label,
        "ablate_largest_drop_logit_change": strongest.logit_change,
        "ablate_top1_changes": sum(outcome.top1_changed for outcome in result.outcomes),
    }


# ----- across images


def spread_table(spread: AblationSpreads) -> Table:
    images = spread.spreads[0].images
    view = Table(
        title=f"{spread.mode}-ablation over {images} images (each image's own target)",
        caption=Text.assemble(_definition(spread.mode, spread.reference), "\n", weights_caption(spread.weights_label)),
    )
    for column in ("ablated", f"mean {spread.measure} change", "mean p change", "top-1 changed"):
        view.add_column(column, justify="right")
    for item in spread.spreads:
        view.add_row(
            item.ablation.label,
            f"{item.mean_logit_change:+.4g}",
            "" if item.mean_probability_change is None else f"{item.mean_probability_change:+.4g}",
            f"{item.top1_changed_fraction:.0%}",
        )
    return view


def spread_rows(spread: AblationSpreads) -> list[dict[str, Any]]:
    return [
        {
            **_site_columns(item.ablation),
            "mode": spread.mode,
            "images": item.images,
            "mean_logit_change": item.mean_logit_change,
            "mean_probability_change": item.mean_probability_change,
            "top1_changed_fraction": item.top1_changed_fraction,
        }
        for item in spread.spreads
    ]


def spread_document(spread: AblationSpreads) -> dict[str, Any]:
    return {
        "weights": spread.weights_label,
        "definition": _definition(spread.mode, spread.reference),
        "mode": spread.mode,
        "reference": spread.reference,
        "images": spread.spreads[0].images,
        "ablations": spread_rows(spread),
    }


def spread_figure(spread: AblationSpreads) -> Any:
    from vitcli import figures

    fig = _heat_figure(
        [item.ablation for item in spread.spreads],
        [item.mean_logit_change for item in spread.spreads],
        spread.depth,
        spread.num_heads,
        f"mean change of the target {spread.measure}",
        notes=[f"{item.top1_changed_fraction:.0%}" if item.top1_changed_fraction else "" for item in spread.spreads],
    )
    images = spread.spreads[0].images
    figures.title(
        fig,
        f"{spread.mode}-ablation over {images} images (in the cells: images whose top-1 changed)",
        spread.weights_label,
    )
    return fig
