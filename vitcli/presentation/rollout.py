"""Attention rollout (`Rollout`) as a table, CSV rows, JSON, a figure and a summary."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from vitcli.experiments.attention import SELF_CHECK_TOLERANCE, patch_map
from vitcli.experiments.rollout import Rollout
from vitcli.presentation.attention import (
    colour_range,
    grid_json,
    mark_query,
    percent,
    place,
    query_json,
    query_label,
    ranked_sources,
    scale_note,
    self_check_json,
    titled_table,
)
from vitcli.render import weights_caption

METHOD = "attention rollout (Abnar and Zuidema 2020): heads fused, identity added, rows renormalized"


def table(result: Rollout) -> Table:
    worst = max(result.self_check.values())
    rollout_table = titled_table(
        result.source.display_path,
        f"{method(result)}: row of {query_label(result.query)}",
        Text.assemble(
            f"rollout (Abnar and Zuidema 2020), not a single head's attention: CLS {percent(result.row[0])}%, "
            f"sum {float(result.row.sum()):.6f}\nself-check max |difference| {worst:.2g} "
            f"(tolerance {SELF_CHECK_TOLERANCE:g})\n",
            weights_caption(result.weights),
        ),
    )
    return ranked_sources(rollout_table, result.grid, result.top(result.top_k), "rollout %")


def rows(result: Rollout) -> list[dict[str, Any]]:
    return [
        {
            "method": "rollout",
            "head_fusion": result.head_fusion,
            "discard_ratio": result.discard_ratio,
            "query": result.query.name,
            "query_token": result.query.token,
            **place(result.grid, token),
            "rollout": value,
        }
        for token, value in enumerate(result.row.tolist())
    ]


def document(result: Rollout) -> dict[str, Any]:
    return {
        "weights": result.weights,
        "method": METHOD,
        "head_fusion": result.head_fusion,
        "discard_ratio": result.discard_ratio,
        "blocks": sorted(result.self_check),
        "query": query_json(result.query),
        "grid": grid_json(result.grid),
        "self_check": self_check_json(result.self_check),
        "rollout": result.row.tolist(),
    }


def summary(result: Rollout) -> dict[str, Any]:
    ((token, value),) = result.top(1)
    return {
        "rollout_query": result.query.name,
        "rollout_cls": float(result.row[0]),
        "rollout_top_source": result.grid.token_name(token),
        "rollout_top_value": value,
        "rollout_self_check_max": max(result.self_check.values()),
    }


def figure(result: Rollout, scale: str = "own") -> Any:
    """The rollout row over the crop; the colour bar's ticks are the raw rollout values, its range the map's own
    (or from 0 with scale "zero"), as its label says."""
    from vitcli import figures

    fig, panels = figures.figure(1, rows=1, size=5.0)
    values = patch_map(result.grid, result.row.float())
    low, high = colour_range([values], scale)
    mappable = figures.overlay(panels[0], result.crop, values, "viridis", low, high)
    mark_query(panels[0], result.grid, result.query)
    panels[0].set_xlabel(f"rollout to CLS {percent(result.row[0])}% (not on the grid)", fontsize=8)
    label = f"rollout (raw values, not rescaled)\n{scale_note(scale, 1, low, high)}"
    fig.colorbar(mappable, ax=panels, shrink=0.8).set_label(label, fontsize=8)
    figures.title(
        fig,
        f"{result.source.display_name}: {method(result)}\n"
        f"row of {query_label(result.query)}: not a single head's attention",
        result.weights,
    )
    return fig


def method(result: Rollout) -> str:
    return (
        f"attention ROLLOUT over {len(result.self_check)} blocks, head fusion {result.head_fusion}, "
        f"discard ratio {result.discard_ratio:g}"
    )
