"""Attention summaries (`AttentionSummary`) as a table, CSV rows, JSON, a figure and a summary."""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.table import Table
from rich.text import Text

from vitcli.experiments.attention import SELF_CHECK_TOLERANCE
from vitcli.experiments.attention_summary import AttentionSummary
from vitcli.presentation.attention import (
    grid_json,
    query_json,
    query_label,
    scale_note,
    self_check_json,
    titled_table,
)
from vitcli.render import weights_caption


def table(result: AttentionSummary) -> Table:
    worst = max(result.self_check.values())
    summary_table = titled_table(
        result.source.display_path,
        f"attention summary of {_query_label(result)}",
        Text.assemble(
            "entropy of the row in bits; mean distance between query and patch sources in patches, weighted by their "
            "share of the patch attention"
            f"\nself-check max |difference| {worst:.2g} (tolerance {SELF_CHECK_TOLERANCE:g})\n",
            weights_caption(result.weights),
        ),
    )
    top = "top source (mean attention %)" if result.query is None else "top source (attention %)"
    for column in ("block", "head", "CLS %", "entropy (bits)", "mean distance", top):
        summary_table.add_column(column, justify="right")
    for entry in result.entries:
        summary_table.add_row(
            str(entry.block),
            str(entry.head),
            f"{100 * entry.cls_mass:.2f}",
            f"{entry.entropy_bits:.3f}",
            "-" if entry.mean_distance is None else f"{entry.mean_distance:.2f}",
            f"{result.grid.token_name(entry.top_token)} {100 * entry.top_attention:.2f}",
        )
    return summary_table


def rows(result: AttentionSummary) -> list[dict[str, Any]]:
    return [
        {
            "query": "all" if result.query is None else result.query.name,
            "block": entry.block,
            "head": entry.head,
            "cls_mass": entry.cls_mass,
            "entropy_bits": entry.entropy_bits,
            "mean_distance_patches": entry.mean_distance,
            "top_source": result.grid.token_name(entry.top_token),
            "top_token": entry.top_token,
            "top_attention": entry.top_attention,
        }
        for entry in result.entries
    ]


def document(result: AttentionSummary) -> dict[str, Any]:
    return {
        "weights": result.weights,
        "query": "all" if result.query is None else query_json(result.query),
        "grid": grid_json(result.grid),
        "self_check": self_check_json(result.self_check),
        "summary": rows(result),
    }


def summary(result: AttentionSummary) -> dict[str, Any]:
    distances = [entry.mean_distance for entry in result.entries if entry.mean_distance is not None]
    return {
        "attention_summary_query": "all" if result.query is None else result.query.name,
        "attention_summary_mean_cls_mass": sum(entry.cls_mass for entry in result.entries) / len(result.entries),
        "attention_summary_mean_entropy_bits": sum(entry.entropy_bits for entry in result.entries)
        / len(result.entries),
        "attention_summary_mean_distance_patches": sum(distances) / len(distances) if distances else None,
        "attention_summary_self_check_max": max(result.self_check.values()),
    }


# (title, colour bar label, value of a summary row) of each panel, one heat map of blocks x heads.
PANELS = (
    ("CLS share of the row", "CLS attention %", lambda entry: 100 * entry.cls_mass),
    ("entropy of the row", "entropy (bits)", lambda entry: entry.entropy_bits),
    ("mean distance to patch sources", "mean distance (patches)", lambda entry: entry.mean_distance),
)


def figure(result: AttentionSummary, scale: str = "own") -> Any:
    """The table's three measures as block x head heat maps, each on its own colour scale (the panel's own range, or
    from 0 with scale "zero"), values written in the cells."""
    from vitcli import figures

    blocks = sorted({entry.block for entry in result.entries})
    heads = sorted({entry.head for entry in result.entries})
    fig, panels = figures.figure(len(PANELS), size=max(2.6, 0.22 * len(blocks) + 1.2))
    for panel, (name, label, value) in zip(panels, PANELS, strict=True):
        grid = np.full((len(blocks), len(heads)), np.nan)
        for entry in result.entries:
            measured = value(entry)
            grid[blocks.index(entry.block), heads.index(entry.head)] = np.nan if measured is None else measured
        if np.isnan(grid).all():
            panel.set_title(f"{name}\n(not defined for this query)", fontsize=9)
            panel.set_axis_off()
            continue
        low = 0.0 if scale == "zero" else float(np.nanmin(grid))
        high = float(np.nanmax(grid))
        image = panel.imshow(grid, cmap="viridis", vmin=low, vmax=high, aspect="auto", interpolation="nearest")
        panel.set_xticks(range(len(heads)), [str(head) for head in heads], fontsize=8)
        panel.set_yticks(range(len(blocks)), [str(block) for block in blocks], fontsize=8)
        panel.set_xlabel("head", fontsize=8)
        panel.set_ylabel("block", fontsize=8)
        panel.set_title(name, fontsize=9)
        if grid.size <= 64:
            for (row, col), number in np.ndenumerate(grid):
                if not np.isnan(number):
                    bright = (number - low) > 0.6 * (high - low)
                    panel.text(col, row, f"{number:.3g}", ha="center", va="center", fontsize=6,
                               color="black" if bright else "white")  # fmt: skip
        colorbar = fig.colorbar(image, ax=panel, shrink=0.8)
        colorbar.set_label(f"{label}\n{scale_note(scale, 1, low, high)}", fontsize=7)
    figures.title(fig, f"{result.source.display_name}: attention summary of {_query_label(result)}", result.weights)
    return fig


def _query_label(result: AttentionSummary) -> str:
    if result.query is None:
        return f"all {result.grid.num_tokens} queries (averaged)"
    return query_label(result.query)
