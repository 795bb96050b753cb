"""Maps of one query's attention (`QueryAttention`) as a table, CSV rows, JSON, a figure and a summary; and the
pieces every attention presentation shares (`attention_summary`, `rollout`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from rich.table import Table
from rich.text import Text
from torch import Tensor

from vitcli.experiments.attention import (
    CAPTURED_CHECK,
    EXPLICIT_CHECK,
    SELF_CHECK_TOLERANCE,
    Query,
    QueryAttention,
    patch_map,
)
from vitcli.grid import PatchGrid
from vitcli.render import weights_caption

MULTI_MAP_TOP = 3  # sources listed per map when one table holds many maps
CHECK_CAPTION = {
    EXPLICIT_CHECK: "explicit vs fused attention output",
    CAPTURED_CHECK: "captured attention @ v vs heads",
}


def table(result: QueryAttention) -> Table:
    if len(result.maps) == 1:
        row = result.maps[0]
        single = titled_table(
            result.source.display_path,
            f"block {row.block}{stage_note(result)}, head {row.head}: attention of {query_label(result.query)}",
            Text.assemble(
                f"{cls_note(result.grid, row.attention)}self attention "
                f"{percent(row.attention[result.query.token])}%, sum over all {result.grid.num_tokens} sources "
                f"{row.total:.6f}\n",
                self_check_caption(result.self_check, result.weights, result.self_check_what),
            ),
        )
        return ranked_sources(single, result.grid, row.top(result.top_k), "attention %")
    many = titled_table(
        result.source.display_path,
        f"attention of {query_label(result.query)}{stage_note(result)}",
        self_check_caption(result.self_check, result.weights, result.self_check_what),
    )
    has_cls = has_class_token(result.grid)
    for column in ("block", "head", "CLS %", "self %", f"top {MULTI_MAP_TOP} sources (%)", "sum"):
        if column != "CLS %" or has_cls:
            many.add_column(column, justify="left" if column.startswith("top") else "right")
    for row in result.maps:
        top = ", ".join(f"{result.grid.token_name(token)} {100 * value:.2f}" for token, value in row.top(MULTI_MAP_TOP))
        cls = [percent(row.attention[0])] if has_cls else []
        many.add_row(
            str(row.block), str(row.head), *cls, percent(row.attention[result.query.token]), top, f"{row.total:.6f}"
        )
    return many


def rows(result: QueryAttention) -> list[dict[str, Any]]:
    return [
        {
            "block": row.block,
            "head": row.head,
            "query": result.query.name,
            "query_token": result.query.token,
            **place(result.grid, token),
            "attention": value,
        }
        for row in result.maps
        for token, value in enumerate(row.attention.tolist())
    ]


def document(result: QueryAttention) -> dict[str, Any]:
    return {
        "weights": result.weights,
        "query": query_json(result.query),
        "grid": grid_json(result.grid),
        "stage": result.stage,
        "self_check": self_check_json(result.self_check, result.self_check_what),
        "maps": [
            {"block": row.block, **row_json(result.grid, row, result.top_k, result.query.token)} for row in result.maps
        ],
    }


def summary(result: QueryAttention) -> dict[str, Any]:
    strongest = max(result.maps, key=lambda row: row.top(1)[0][1])
    token, value = strongest.top(1)[0]
    return {
        "attention_query": result.query.name,
        "attention_maps": len(result.maps),
        "attention_mean_cls": sum(float(row.attention[0]) for row in result.maps) / len(result.maps)
        if has_class_token(result.grid)
        else None,
        "attention_top_source": result.grid.token_name(token),
        "attention_top_value": value,
        "attention_top_block": strongest.block,
        "attention_top_head": strongest.head,
        "attention_self_check_max": max(result.self_check.values()),
    }


def figure(result: QueryAttention, scale: str = "own") -> Any:
    """The crop with each map as a heat overlay on one common colour scale: the maps' own range of patch attention
    (scale "own", so near-uniform rows still show their structure) or 0 to its largest value (scale "zero")."""
    from vitcli import figures

    blocks = sorted({row.block for row in result.maps})
    heads = sorted({row.head for row in result.maps})
    shown = result.maps
    if len(blocks) > 1 and len(heads) > 1:
        # Heads down, blocks across: reading left to right follows the query through depth.
        panel_rows, columns = len(heads), len(blocks)
        shown = sorted(result.maps, key=lambda row: (row.head, row.block))
    else:
        columns = min(len(shown), 6)
        panel_rows = math.ceil(len(shown) / columns)
    maps = [patch_map(result.grid, row.attention) for row in shown]
    low, high = colour_range(maps, scale)
    size = 5.0 if len(maps) == 1 else 3.2 if len(maps) <= 12 else 2.4
    fig, panels = figures.figure(columns, rows=panel_rows, size=size)
    for panel, row, values in zip(panels, shown, maps, strict=False):
        mappable = figures.overlay(panel, result.crop, values, "inferno", low, high)
        mark_query(panel, result.grid, result.query)
        panel.set_title(f"block {row.block}{stage_note(result)}, head {row.head}", fontsize=9)
        if has_class_token(result.grid):
            panel.set_xlabel(f"CLS attention {percent(row.attention[0])}% (not on the grid)", fontsize=8)
    for panel in panels[len(maps) :]:
        panel.set_visible(False)
    colorbar = fig.colorbar(mappable, ax=panels, shrink=0.8 if panel_rows == 1 else 0.6)
    colorbar.set_label(f"attention (not renormalized)\n{scale_note(scale, len(maps), low, high)}", fontsize=8)
    together = "" if len(maps) == 1 else "; one colour scale for all maps"
    figures.title(
        fig, f"{result.source.display_name}: attention of query {query_label(result.query)}{together}", result.weights
    )
    return fig


def colour_range(maps: list[Any], scale: str) -> tuple[float, float]:
    """The colour limits of patch maps: their own smallest to largest value, or 0 to the largest (scale "zero")."""
    high = max(float(np.nanmax(values)) for values in maps)
    low = 0.0 if scale == "zero" else min(float(np.nanmin(values)) for values in maps)
    return low, high


def scale_note(scale: str, maps: int, low: float, high: float) -> str:
    """What the colour bar's range is, for its label."""
    whose = "this map's" if maps == 1 else "the maps'"
    if scale == "zero":
        return f"colours from 0 to {whose} largest patch value, {high:.4g}"
    return f"colours span {whose} own range, {low:.4g} to {high:.4g}"


# ----- shared by every attention presentation


def query_label(query: Query) -> str:
    if query.patch is None:
        return f"{query.name} (token {query.token})"
    return f"{query.name} (token {query.token}, row {query.row}, col {query.col})"


def stage_note(result: QueryAttention) -> str:
    """(stage 2, 28x28 grid)" for a model of stages (Swin), else nothing."""
    if result.stage is None:
        return ""
    return f" (stage {result.stage}, {result.grid.rows}x{result.grid.cols} grid)"


def has_class_token(grid: PatchGrid) -> bool:
    return grid.num_prefix > 0 and grid.prefix_names[0] == "CLS"


def row_json(grid: PatchGrid, row: Any, top_k: int, query: int | None = None) -> dict[str, Any]:
    """One head's attention row as JSON: its CLS share (where there is a CLS), the query token's own share (for a
    token's query; an attention pooling's latent query has none), sum, top sources and every value."""
    shares = {"self_attention": float(row.attention[query])} if query is not None else {}
    return {
        "head": row.head,
        "cls_attention": float(row.attention[0]) if has_class_token(grid) else None,
        **shares,
        "sum": row.total,
        "top": [{**place(grid, token), "attention": value} for token, value in row.top(top_k)],
        "attention": row.attention.tolist(),
    }


def cls_note(grid: PatchGrid, attention: Tensor) -> str:
    return f"CLS attention {percent(attention[0])}%, " if has_class_token(grid) else ""


def self_check_caption(self_check: dict[int, float], weights: str, what: str = EXPLICIT_CHECK) -> Text:
    return Text.assemble(
        f"self-check: {CHECK_CAPTION[what]}, max |difference| {max(self_check.values()):.2g} "
        f"(tolerance {SELF_CHECK_TOLERANCE:g})\n",
        weights_caption(weights),
    )


def titled_table(shown_path: str, what: str, caption: str | Text) -> Table:
    """A table titled by what it shows (kept on one line) and the image it shows it for (its path as shown)."""
    return Table(title=f"{what}\n{shown_path}", caption=caption, min_width=len(what) + 4)


def ranked_sources(table: Table, grid: PatchGrid, ranked: list[tuple[int, float]], value_column: str) -> Table:
    """Fill a table with sources ranked by a share of attention: rank, token, patch, row, col, percent."""
    for column in ("rank", "token", "patch", "row", "col", value_column):
        table.add_column(column, justify="right")
    for rank, (token, value) in enumerate(ranked, start=1):
        where = place(grid, token)
        table.add_row(
            str(rank), str(token), where["patch"], blank(where["row"]), blank(where["col"]), f"{100 * value:.4f}"
        )
    return table


def place(grid: PatchGrid, token: int) -> dict[str, Any]:
    patch = grid.patch_of_token(token)
    row, col = grid.position(patch) if patch is not None else (None, None)
    return {"token": token, "patch": grid.token_name(token), "row": row, "col": col}


def percent(value: Tensor | float) -> str:
    return f"{100 * float(value):.2f}"


def blank(value: int | None) -> str:
    return "-" if value is None else str(value)


def query_json(query: Query) -> dict[str, Any]:
    return {"token": query.token, "name": query.name, "patch": query.patch, "row": query.row, "col": query.col}


def grid_json(grid: PatchGrid) -> dict[str, Any]:
    return {
        "rows": grid.rows,
        "cols": grid.cols,
        "patch_size": grid.patch_size,
        "tokens": grid.num_tokens,
        "prefix_tokens": list(grid.prefix_names),
    }


def self_check_json(self_check: dict[int, float], what: str = EXPLICIT_CHECK) -> dict[str, Any]:
    return {
        "tolerance": SELF_CHECK_TOLERANCE,
        "what": what,
        "max_abs_difference_by_block": {str(block): difference for block, difference in sorted(self_check.items())},
    }


def mark_query(panel: Any, grid: PatchGrid, query: Query) -> None:
    from vitcli import figures

    if query.patch is not None:
        figures.outline(panel, grid.pixel_box(query.patch), color="cyan")
