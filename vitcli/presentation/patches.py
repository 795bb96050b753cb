"""The patch grid and projection as tables, CSV rows, JSON and a numbered-grid figure."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table

from vitcli.experiments.patches import PatchDetail, PatchRows
from vitcli.render import weights_caption


def grid_facts(result: PatchRows) -> dict[str, Any]:
    grid = result.grid
    return {
        "image_height": grid.image_height,
        "image_width": grid.image_width,
        "patch_size": grid.patch_size,
        "grid_rows": grid.rows,
        "grid_cols": grid.cols,
        "patches": grid.num_patches,
        "prefix_tokens": list(grid.prefix_names),
        "rows_with_prefix": grid.num_tokens,
        "values_per_patch": result.values_per_patch,
        "embed_dim": result.embed_dim,
        "flattening": "channel-major: R rows, then G, then B; index c*p*p + row*p + col",
        "projection_max_abs_difference_vs_conv2d": result.projection_max_difference,
    }


def table(result: PatchRows, shown_values: int) -> Group:
    grid = result.grid
    facts = Table(
        title=f"{result.source.display_name}: patches", caption=weights_caption(result.weights), show_header=False
    )
    facts.add_column("fact")
    facts.add_column("value", justify="right")
    facts.add_row("model input", f"{grid.image_height}x{grid.image_width} crop")
    facts.add_row("patch size", f"{grid.patch_size}x{grid.patch_size}")
    facts.add_row("grid", f"{grid.rows} rows x {grid.cols} cols")
    facts.add_row("patches", f"P1..P{grid.num_patches}")
    facts.add_row("rows with " + "+".join(grid.prefix_names), str(grid.num_tokens))
    facts.add_row(
        "values per patch", f"{result.values_per_patch} (3x{grid.patch_size}x{grid.patch_size}, R then G then B)"
    )
    facts.add_row("projection", f"{result.values_per_patch} -> {result.embed_dim} (one shared W_E, b_E)")
    facts.add_row("max |X W_E + b_E - Conv2d|", f"{result.projection_max_difference:.3g}")
    parts: list[Any] = [facts]
    if grid.rows <= 24:
        parts.append(_numbering_table(result))
    parts.extend(_detail_table(result, detail, shown_values) for detail in result.selected)
    return Group(*parts)


def _numbering_table(result: PatchRows) -> Table:
    grid = result.grid
    numbers = Table(title="patch numbers (row, col zero-based)", padding=(0, 0))
    numbers.add_column("", justify="right", style="dim")
    for col in range(grid.cols):
        numbers.add_column(f"c{col}", justify="right")
    for row in range(grid.rows):
        numbers.add_row(f"r{row}", *(str(grid.patch_at(row, col)) for col in range(grid.cols)))
    return numbers


def _detail_table(result: PatchRows, detail: PatchDetail, shown: int) -> Table:
    facts = result.grid.describe_patch(detail.patch)
    detail_table = Table(
        title=(
            f"{facts['patch']} = token {facts['token']}: row {facts['row']}, col {facts['col']} zero-based "
            f"(row {facts['row_1based']}, col {facts['col_1based']} from one); "
            f"pixels x {facts['left']}..{facts['right'] - 1}, y {facts['top']}..{facts['bottom'] - 1}"
        )
    )
    detail_table.add_column("vector")
    detail_table.add_column("length", justify="right")
    detail_table.add_column(f"first {shown} values")
    for name, values in (
        ("normalized pixels (R first)", detail.pixels),
        ("projection X W_E + b_E", detail.projection),
        ("position embedding", detail.position),
        ("sum entering block 1", detail.block_input),
    ):
        detail_table.add_row(name, str(len(values)), " ".join(f"{value:+.4f}" for value in values[:shown]))
    return detail_table


def rows(result: PatchRows, shown_values: int) -> list[dict[str, Any]]:
    """One row per patch: its numbering facts and the first projection values."""
    grid = result.grid
    return [
        {
            **grid.describe_patch(patch),
            **{f"proj_{index}": value for index, value in enumerate(result.projections[patch - 1][:shown_values])},
        }
        for patch in range(1, grid.num_patches + 1)
    ]


def document(result: PatchRows) -> dict[str, Any]:
    return {
        "weights": result.weights,
        "grid": grid_facts(result),
        "selected": [
            {
                **result.grid.describe_patch(detail.patch),
                "pixels": detail.pixels,
                "projection": detail.projection,
                "position_embedding": detail.position,
                "block1_input": detail.block_input,
            }
            for detail in result.selected
        ],
    }


def summary(result: PatchRows) -> dict[str, Any]:
    return {"patches_projection_max_difference": result.projection_max_difference}


def figure(result: PatchRows) -> Any:
    """The crop with the patch grid and every patch number; selected patches outlined."""
    from vitcli import figures

    grid = result.grid
    fig, (panel,) = figures.figure(size=7.0)
    figures.show_crop(panel, result.crop)
    figures.draw_grid(panel, grid, numbers=True)
    for detail in result.selected:
        figures.outline(panel, grid.pixel_box(detail.patch), color="yellow", width=2.5)
    figures.title(
        fig,
        f"{result.source.display_name}: {grid.image_height}x{grid.image_width} crop, "
        f"{grid.rows}x{grid.cols} patches of {grid.patch_size}px (P1..P{grid.num_patches}, row by row)",
        result.weights,
    )
    return fig
