"""`attend --pool` (`PoolAttention`): the attention pooling's attention over the final rows as a table, CSV rows,
JSON, a figure on the patch grid and a summary."""

from __future__ import annotations

import math
from typing import Any

from rich.table import Table
from rich.text import Text

from vitcli.experiments.attention import SELF_CHECK_TOLERANCE, patch_map
from vitcli.experiments.attention_pool import POOL_CHECK, PoolAttention
from vitcli.presentation.attention import (
    MULTI_MAP_TOP,
    cls_note,
    colour_range,
    grid_json,
    has_class_token,
    percent,
    place,
    ranked_sources,
    row_json,
    scale_note,
    titled_table,
)
from vitcli.render import weights_caption

WHO = "the attention pooling's latent query"


def caption(result: PoolAttention) -> Text:
    latents = f"; the first of its {result.latents} latent queries" if result.latents > 1 else ""
    return Text.assemble(
        f"self-check: pattern vs its weights' softmax and proj(pattern @ v) vs the pooling's output, max |difference| "
        f"{result.self_check:.2g} (tolerance {SELF_CHECK_TOLERANCE:g}){latents}\n",
        weights_caption(result.weights),
    )


def table(result: PoolAttention) -> Table:
    if len(result.maps) == 1:
        row = result.maps[0]
        cls = cls_note(result.grid, row.attention)
        single = titled_table(
            result.source.display_path,
            f"attention pooling, head {row.head}: attention of its latent query",
            f"{cls}sum over all {result.grid.num_tokens} rows {row.total:.6f}\n{caption(result)}",
        )
        return ranked_sources(single, result.grid, row.top(result.top_k), "attention %")
    many = titled_table(result.source.display_path, f"attention pooling: attention of {WHO}", caption(result))
    has_cls = has_class_token(result.grid)
    for column in ("head", "CLS %", f"top {MULTI_MAP_TOP} rows (%)", "sum"):
        if column != "CLS %" or has_cls:
            many.add_column(column, justify="left" if column.startswith("top") else "right")
    for row in result.maps:
        top = ", ".join(f"{result.grid.token_name(token)} {100 * value:.2f}" for token, value in row.top(MULTI_MAP_TOP))
        cls = [percent(row.attention[0])] if has_cls else []
        many.add_row(str(row.head), *cls, top, f"{row.total:.6f}")
    return many


def rows(result: PoolAttention) -> list[dict[str, Any]]:
    return [
        {"head": row.head, **place(result.grid, token), "attention": value}
        for row in result.maps
        for token, value in enumerate(row.attention.tolist())
    ]


def document(result: PoolAttention) -> dict[str, Any]:
    return {
        "weights": result.weights,
        "query": {"name": "latent", "latents": result.latents, "shown": 1},
        "grid": grid_json(result.grid),
        "self_check": {"tolerance": SELF_CHECK_TOLERANCE, "what": POOL_CHECK, "max_abs_difference": result.self_check},
        "maps": [row_json(result.grid, row, result.top_k) for row in result.maps],
    }


def summary(result: PoolAttention) -> dict[str, Any]:
    strongest = max(result.maps, key=lambda row: row.top(1)[0][1])
    token, value = strongest.top(1)[0]
    return {
        "pool_attention_maps": len(result.maps),
        "pool_attention_top_source": result.grid.token_name(token),
        "pool_attention_top_value": value,
        "pool_attention_top_head": strongest.head,
        "pool_attention_self_check_max": result.self_check,
    }


def figure(result: PoolAttention, scale: str = "own") -> Any:
    """The crop with each head's map as a heat overlay, on one common colour scale (see attention.figure)."""
    from vitcli import figures

    columns = min(len(result.maps), 6)
    panel_rows = math.ceil(len(result.maps) / columns)
    maps = [patch_map(result.grid, row.attention) for row in result.maps]
    low, high = colour_range(maps, scale)
    fig, panels = figures.figure(columns, rows=panel_rows, size=5.0 if len(maps) == 1 else 3.2)
    for panel, row, values in zip(panels, result.maps, maps, strict=False):
        mappable = figures.overlay(panel, result.crop, values, "inferno", low, high)
        panel.set_title(f"attention pooling, head {row.head}", fontsize=9)
        if has_class_token(result.grid):
            panel.set_xlabel(f"CLS attention {percent(row.attention[0])}% (not on the grid)", fontsize=8)
    for panel in panels[len(maps) :]:
        panel.set_visible(False)
    colorbar = fig.colorbar(mappable, ax=panels, shrink=0.8 if panel_rows == 1 else 0.6)
    colorbar.set_label(f"attention (not renormalized)\n{scale_note(scale, len(maps), low, high)}", fontsize=8)
    together = "" if len(maps) == 1 else "; one colour scale for all maps"
    figures.title(fig, f"{result.source.display_name}: attention of {WHO}{together}", result.weights)
    return fig
