"""The occlusion experiments as people and programs see them: quadrants (`QuadrantOcclusion`) and sliding
windows (`PatchOcclusion`).

`table`, `rows`, `document`, `figure` and `summary` accept either result; `drop_grid_text` is the sliding windows'
drop grid as CSV text, one grid row per line. An embedding target (vitcli.targets) shows its score where a class
shows its probability, and its drop in the score's units where a class drops in percentage points (the JSON's
`drop_unit` says which; its keys keep their names).
"""

from __future__ import annotations

from functools import singledispatch
from typing import Any

from rich.console import Group
from rich.table import Table

from vitcli.experiments.occlusion import PatchOcclusion, QuadrantOcclusion
from vitcli.experiments.results import EmbeddingScore
from vitcli.presentation import occlusion_fields as fields
from vitcli.render import weights_caption

STRONGEST_SHOWN = 5  # covers listed in the sliding windows' table


# ----- tables


@singledispatch
def table(result: Any) -> Any:
    raise TypeError(f"no occlusion table for {type(result).__name__}")


@table.register
def _quadrant_table(result: QuadrantOcclusion) -> Table:
    base = result.base
    heading = f"{base.fill} quadrants, target {fields.short(base.target)}{fields.top1_note(base)}"
    quadrants = Table(
        title=f"{base.source.display_path}\n{heading}",
        caption=weights_caption(base.weights),
    )
    value, drop = fields.value_heads(base)
    for column in ("region", "box l,t,r,b", value, drop, "top-1 after", "max"):
        quadrants.add_column(
            column,
            justify="right" if column in (value, drop) else "left",
            no_wrap=column == "box l,t,r,b",
        )
    largest = result.largest
    for outcome in result.outcomes:
        quadrants.add_row(
            outcome.cover.name,
            fields.box_text(outcome.cover.box),
            f"{outcome.target_probability:.6f}",
            fields.points(outcome.drop),
            fields.top1_after(outcome),
            "<-" if outcome is largest else "",
            style="bold" if outcome is largest else None,
        )
    return quadrants


@table.register
def _patch_table(result: PatchOcclusion) -> Group:
    base, counts, largest, windows = result.base, result.counts, result.largest, result.windows
    facts = Table(
        title=f"{base.source.display_path}  {len(result.outcomes)} covers of {windows.size}x{windows.size} px, stride "
        f"{windows.stride}, {base.fill} fill: target {fields.short(base.target)}",
        caption=weights_caption(base.weights),
        show_header=False,
    )
    facts.add_column("quantity")
    facts.add_column("value")
    facts.add_row(
        f"largest {fields.value_heads(base)[1]}", f"{fields.points(largest.drop)} at {fields.where(largest.cover)}"
    )
    facts.add_row(
        "covers lowering / raising / not changing it", f"{counts.lowered} / {counts.raised} / {counts.unchanged}"
    )
    facts.add_row(
        f"{fields.value_heads(base)[0]} under a cover: min .. max",
        f"{counts.min_covered_probability:.6f} .. {counts.max_covered_probability:.6f}",
    )
    facts.add_row(
        "top-1 changed",
        f"yes, by {counts.top1_changed_covers} covers"
        if counts.top1_changed_covers
        else "not followed: the forward ends at the embedding"
        if base.top1 is None
        else f"no: stays {fields.short(base.top1)}",
    )
    if result.uncovered_pixels:
        facts.add_row("pixels no window reaches", str(result.uncovered_pixels))
    strongest = Table(title=f"largest drops{fields.top1_note(base)}")
    value, drop = fields.value_heads(base)
    for column in ("cover", "row", "col", "box l,t,r,b", value, drop, "top-1 after"):
        strongest.add_column(
            column,
            justify="right" if column in ("row", "col", value, drop) else "left",
            no_wrap=column == "box l,t,r,b",
        )
    for outcome in sorted(result.outcomes, key=lambda outcome: outcome.drop, reverse=True)[:STRONGEST_SHOWN]:
        strongest.add_row(
            outcome.cover.name,
            str(outcome.cover.row),
            str(outcome.cover.col),
            fields.box_text(outcome.cover.box),
            f"{outcome.target_probability:.6f}",
            fields.points(outcome.drop),
            fields.top1_after(outcome),
        )
    return Group(facts, strongest)


# ----- CSV rows


@singledispatch
def rows(result: Any) -> list[dict[str, Any]]:
    raise TypeError(f"no occlusion rows for {type(result).__name__}")


@rows.register
def _quadrant_rows(result: QuadrantOcclusion) -> list[dict[str, Any]]:
    largest = result.largest
    return [
        {
            **fields.row_prefix(result.base),
            "region": outcome.cover.name,
            **{
                key: value
                for key, value in fields.outcome_fields(outcome, result.base).items()
                if key not in ("cover", "patch")
            },
            "largest_drop": outcome is largest,
            "fill": result.base.fill,
        }
        for outcome in result.outcomes
    ]


@rows.register
def _patch_rows(result: PatchOcclusion) -> list[dict[str, Any]]:
    return [
        {**fields.row_prefix(result.base), **fields.outcome_fields(outcome, result.base), "fill": result.base.fill}
        for outcome in result.outcomes
    ]


def drop_grid_text(result: PatchOcclusion) -> str:
    """The drop grid in points, one grid row per line, full precision; NaN where a patch is not fully covered."""
    return "\n".join(",".join(repr(value) for value in row) for row in result.drop_grid.tolist()) + "\n"


# ----- JSON documents


@singledispatch
def document(result: Any) -> dict[str, Any]:
    raise TypeError(f"no occlusion document for {type(result).__name__}")


@document.register
def _quadrant_document(result: QuadrantOcclusion) -> dict[str, Any]:
    return {
        **fields.baseline_json(result.base),
        "drop_unit": fields.drop_unit(result.base),
        "largest_drop_region": result.largest.cover.name,
        "quadrants": [fields.outcome_fields(outcome, result.base) for outcome in result.outcomes],
    }


@document.register
def _patch_document(result: PatchOcclusion) -> dict[str, Any]:
    windows = result.windows
    return {
        **fields.baseline_json(result.base),
        "drop_unit": fields.drop_unit(result.base),
        "window": {"size": windows.size, "stride": windows.stride, "rows": windows.rows, "cols": windows.cols},
        "summary": _patch_facts(result),
        "drop_grid_points": result.drop_grid.tolist(),
        "covers": [fields.outcome_fields(outcome, result.base) for outcome in result.outcomes],
    }


def _patch_facts(result: PatchOcclusion) -> dict[str, Any]:
    largest, counts = result.largest, result.counts
    return {
        "covers": len(result.outcomes),
        "largest_drop_points": largest.drop,
        "largest_drop_cover": largest.cover.name,
        "largest_drop_patch": f"P{largest.cover.patch}" if largest.cover.patch else None,
        "largest_drop_row": largest.cover.row,
        "largest_drop_col": largest.cover.col,
        "largest_drop_box": list(largest.cover.box),
        "lowered": counts.lowered,
        "raised": counts.raised,
        "unchanged": counts.unchanged,
        "min_covered_probability": counts.min_covered_probability,
        "max_covered_probability": counts.max_covered_probability,
        "top1_changed": counts.top1_changed_covers > 0,
        "top1_changed_covers": counts.top1_changed_covers,
        "uncovered_pixels": result.uncovered_pixels,
    }


# ----- headline numbers for a batch run's summary.csv


@singledispatch
def summary(result: Any) -> dict[str, Any]:
    raise TypeError(f"no occlusion summary for {type(result).__name__}")


@summary.register
def _quadrant_summary(result: QuadrantOcclusion) -> dict[str, Any]:
    largest = result.largest
    return {
        "quadrants_target_class": fields.target_cell(result.base.target),
        "quadrants_clean_probability": fields.clean_value(result.base.target),
        "quadrants_largest_drop_region": largest.cover.name,
        "quadrants_largest_drop_points": largest.drop,
        "quadrants_top1_changed": any(outcome.top1_changed for outcome in result.outcomes),
    }


@summary.register
def _patch_summary(result: PatchOcclusion) -> dict[str, Any]:
    largest = result.largest
    return {
        "occlusion_target_class": fields.target_cell(result.base.target),
        "occlusion_clean_probability": fields.clean_value(result.base.target),
        "occlusion_largest_drop_cover": largest.cover.name,
        "occlusion_largest_drop_points": largest.drop,
        "occlusion_lowered": result.counts.lowered,
        "occlusion_top1_changed_covers": result.counts.top1_changed_covers,
    }


# ----- figures


@singledispatch
def figure(result: Any) -> Any:
    raise TypeError(f"no occlusion figure for {type(result).__name__}")


@figure.register
def _quadrant_figure(result: QuadrantOcclusion) -> Any:
    """The clean crop large on the left, the four covered copies in a 2x2 block beside it where their quadrants
    lie: about 8 x 4.6 inches, so the titles stay readable when a report card shows it 600-800 pixels wide."""
    import matplotlib.pyplot as plt

    from vitcli.figures import outline, show_crop, title

    base = result.base
    fig = plt.figure(figsize=(8.0, 4.6), layout="constrained")
    layout = fig.add_gridspec(2, 4)
    clean = fig.add_subplot(layout[:, :2])
    quadrants = [fig.add_subplot(layout[row, col]) for row in (0, 1) for col in (2, 3)]
    for panel in [clean, *quadrants]:
        panel.set_xticks([])
        panel.set_yticks([])
    show_crop(clean, result.crop)
    symbol = "score" if isinstance(base.target, EmbeddingScore) else "p"
    clean.set_title(f"clean: {symbol} = {fields.clean_value(base.target):.4g}", fontsize=11)
    largest = result.largest
    for panel, outcome, covered in zip(quadrants, result.outcomes, result.covered_crops, strict=True):
        show_crop(panel, covered)
        outline(panel, outcome.cover.box)
        marker = "\nlargest drop" if outcome is largest else ""
        panel.set_title(
            f"{outcome.cover.name}: {symbol} = {outcome.target_probability:.3g}\n"
            f"drop {fields.points(outcome.drop)}{'' if symbol == 'score' else ' pts'}{marker}",
            fontsize=9,
            fontweight="bold" if outcome is largest else "normal",
        )
    title(
        fig,
        f"{base.source.display_name}: {fields.measure(base.target)}\nwith each quadrant covered ({base.fill} fill)",
        base.weights,
    )
    return fig


@figure.register
def _patch_figure(result: PatchOcclusion) -> Any:
    from vitcli.figures import draw_grid, outline, overlay, show_crop, title
    from vitcli.figures import figure as panels_figure

    base, windows = result.base, result.windows
    reach = max(abs(outcome.drop) for outcome in result.outcomes) or 1e-9
    fig, panels = panels_figure(2, size=4.5)
    show_crop(panels[0], result.crop)
    draw_grid(panels[0], result.grid)
    panels[0].set_title("input crop", fontsize=9)
    mappable = overlay(panels[1], result.crop, result.pixel_map.numpy(), "RdBu_r", -reach, reach, alpha=0.75)
    largest = result.largest
    outline(panels[1], largest.cover.box, color="black", width=2.5)
    panels[1].set_title(
        f"drop map, colour scale centred on 0\noutlined: largest drop, {largest.cover.name} "
        f"(row {largest.cover.row}, col {largest.cover.col})\n{fields.points(largest.drop)} points",
        fontsize=9,
    )
    unit = (
        f"drop in {base.target.target.unit} (red: it fell)"
        if isinstance(base.target, EmbeddingScore)
        else "drop in percentage points (red: probability fell)"
    )
    fig.colorbar(mappable, ax=panels, shrink=0.8, pad=0.03, label=unit)
    title(
        fig,
        f"{base.source.display_name}: drop in {fields.measure(base.target)} "
        f"({len(result.outcomes)} covers {windows.size}x{windows.size} px, stride {windows.stride}, {base.fill} fill)",
        base.weights,
    )
    return fig
