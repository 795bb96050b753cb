"""Compare results as tables, long-form rows, JSON, a figure and summary numbers."""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.console import Group
from rich.table import Table

from vitcli.experiments.compare import (
    DIFFER_TOLERANCE,
    POOLINGS,
    SELF_CHECK_TOLERANCE,
    CompareResult,
    PairTrajectory,
    letter,
)
from vitcli.render import weights_caption

MATCHES_SHOWN = 8
MATRIX_SHOWN = 12  # the terminal prints the cosine matrix up to this many images; beyond, its extreme pairs
EXTREMES_SHOWN = 5
NAMED_IN_TITLE = 5  # up to this many images the figure's title names them all, beyond only A and B


def _pair_name(pair: PairTrajectory) -> str:
    return f"{letter(pair.first)}~{letter(pair.second)}"


def table(result: CompareResult) -> Group:
    parts: list[Any] = [_images_table(result), _depth_table(result)]
    for pair in result.pairs:
        differ = "never" if pair.first_differing_block is None else f"block {pair.first_differing_block}"
        parts.append(
            f"{_pair_name(pair)}: CLS rows entering block 1 (class token parameter + its position vector) differ by "
            f"L2 {pair.cls_input_distance:.3g}; block 1's CLS queries by {pair.first_query_distance:.3g}; first block "
            f"whose CLS outputs differ (L2 > {DIFFER_TOLERANCE:g} x the larger norm): {differ}"
        )
    for index in range(len(result.images)):
        parts.append(_readout_table(result, index))
        parts.append(_pooling_table(result, index))
    parts.append(_matrix_table(result))
    if result.patch_matches is not None:
        parts.append(_matches_table(result))
    parts.append(
        f"check: largest |w_c . h + b_c - model logit| {result.readout_error:.3g}; largest |model's own pooling, "
        f"recomputed - model logits| {result.pooling_error:.3g} (tolerance {SELF_CHECK_TOLERANCE:g})"
    )
    return Group(*parts)


def _images_table(result: CompareResult) -> Table:
    images = Table(title=f"{result.model_name}: same model, different inputs", caption=weights_caption(result.weights))
    for column in ("image", "file", "top-1 class", "label", "probability"):
        images.add_column(column, justify="right" if column in ("top-1 class", "probability") else "left")
    for index, comparison in enumerate(result.images):
        best = comparison.top[0]
        images.add_row(
            letter(index), comparison.source.display_path, str(best.index), best.label, f"{best.probability:.6f}"
        )
    return images


def _depth_table(result: CompareResult) -> Table:
    depth = Table(title="CLS rows and mean patch rows through the depth (0 = rows entering block 1)")
    depth.add_column("block", justify="right")
    for pair in result.pairs:
        for what in ("CLS cos", "CLS L2", "mean cos", "mean L2"):
            depth.add_column(f"{_pair_name(pair)} {what}", justify="right")
    for block in range(len(result.pairs[0].cls_cosine)):
        cells = [str(block)]
        for pair in result.pairs:
            cells += [
                f"{pair.cls_cosine[block]:.4f}",
                f"{pair.cls_distance[block]:.4g}",
                f"{pair.patch_mean_cosine[block]:.4f}",
                f"{pair.patch_mean_distance[block]:.4g}",
            ]
        depth.add_row(*cells)
    return depth


def _readout_table(result: CompareResult, index: int) -> Table:
    comparison = result.images[index]
    readout = Table(
        title=f"{letter(index)} ({comparison.source.display_name}): classifier readout logit = w_c . h + b_c",
        caption=(
            f"softmax: p_c = exp(z_c - {comparison.max_logit:.4f}) / {comparison.shifted_exp_sum:.4f} "
            "(the largest logit, and the sum over every class j of exp(z_j - largest logit))"
        ),
    )
    for column in ("class", "label", "w_c . h", "b_c", "sum", "model logit", "probability", "largest w_c,i h_i"):
        readout.add_column(column, justify="left" if column in ("label", "largest w_c,i h_i") else "right")
    for entry in comparison.readouts:
        dimensions = ", ".join(f"d{item.dimension} {item.product:+.3f}" for item in entry.top_dimensions[:5])
        numbers = (entry.dot, entry.bias, entry.logit, entry.model_logit)
        readout.add_row(
            str(entry.index),
            entry.label,
            *(f"{number:+.4f}" for number in numbers),
            f"{entry.probability:.6f}",
            dimensions + ", ...",
        )
    return readout


def _pooling_table(result: CompareResult, index: int) -> Table:
    comparison = result.images[index]
    own = POOLINGS.get(result.model_pooling, result.model_pooling)
    pooling = Table(
        title=f"{letter(index)}: the same head on the CLS row and on the mean of the final patch rows",
        caption=(
            f"this model's forward reads out the {own} (global_pool={result.model_pooling!r}), the readout its head "
            "is trained for; the other column applies the same head to features it was not trained on"
        ),
    )
    pooling.add_column("rank", justify="right")
    for readout in comparison.poolings:
        marker = " (model's own)" if readout.is_model_own else ""
        pooling.add_column(f"{readout.description}{marker}")
        pooling.add_column("probability", justify="right")
    for rank in range(len(comparison.poolings[0].top)):
        cells = [str(rank + 1)]
        for readout in comparison.poolings:
            entry = readout.top[rank]
            cells += [f"{entry.index} {entry.label}", f"{entry.probability:.6f}"]
        pooling.add_row(*cells)
    return pooling


def _matrix_table(result: CompareResult) -> Table:
    if len(result.images) > MATRIX_SHOWN:
        return _extremes_table(result)
    matrix = Table(title="cosine similarity of the final (normalized) CLS rows")
    matrix.add_column("")
    for index in range(len(result.images)):
        matrix.add_column(letter(index), justify="right")
    for index, line in enumerate(result.cls_cosine_matrix):
        matrix.add_row(letter(index), *(f"{value:.4f}" for value in line))
    return matrix


def _extremes_table(result: CompareResult) -> Table:
    """The most and the least similar pairs, when the N x N matrix is too wide for a terminal."""
    matrix = np.array(result.cls_cosine_matrix)
    firsts, seconds = np.triu_indices(len(matrix), k=1)
    order = np.argsort(matrix[firsts, seconds], kind="stable")
    shown = list(order[::-1][:EXTREMES_SHOWN]) + list(order[:EXTREMES_SHOWN][::-1])
    extremes = Table(
        title=f"cosine similarity of the final (normalized) CLS rows: the {EXTREMES_SHOWN} most and least similar of "
        f"{len(firsts)} pairs",
        caption=f"the whole {len(matrix)} x {len(matrix)} matrix is in the CSV, the JSON and the figure",
    )
    for column in ("pair", "first image", "second image", "cosine"):
        extremes.add_column(column, justify="right" if column == "cosine" else "left")
    for position in shown:
        first, second = int(firsts[position]), int(seconds[position])
        extremes.add_row(
            f"{letter(first)}~{letter(second)}",
            result.images[first].source.display_name,
            result.images[second].source.display_name,
            f"{matrix[first, second]:.4f}",
        )
    return extremes


def _matches_table(result: CompareResult) -> Table:
    matches = result.patch_matches
    order = np.argsort(matches.best_cosine)[::-1][:MATCHES_SHOWN]
    mean = float(np.mean(matches.best_cosine))
    best = Table(
        title=f"patches of A and their best match in B (final rows, cosine); mean best cosine {mean:.4f}",
        caption="every patch is in the CSV and JSON",
    )
    for column in ("patch of A", "best match in B", "cosine"):
        best.add_column(column, justify="right")
    for position in order:
        best.add_row(f"P{position + 1}", f"P{matches.best_match[position]}", f"{matches.best_cosine[position]:.4f}")
    return best


def rows(result: CompareResult) -> list[dict[str, Any]]:
    """Long-form rows, one `kind` per table; every row has every column (None where it does not apply)."""
    columns = (
        "kind",
        "image_label",
        "image_path",
        "other_label",
        "block",
        "pooling",
        "model_readout",
        "rank",
        "class_index",
        "label",
        "value",
        "cls_cosine",
        "cls_distance",
        "patch_mean_cosine",
        "patch_mean_distance",
        "dot",
        "bias",
        "logit",
        "model_logit",
        "probability",
        "patch",
        "best_match",
    )
    table_rows: list[dict[str, Any]] = []

    def add(**values: Any) -> None:
        table_rows.append({column: values.get(column) for column in columns})

    for pair in result.pairs:
        for block in range(len(pair.cls_cosine)):
            add(
                kind="depth",
                image_label=letter(pair.first),
                other_label=letter(pair.second),
                block=block,
                cls_cosine=pair.cls_cosine[block],
                cls_distance=pair.cls_distance[block],
                patch_mean_cosine=pair.patch_mean_cosine[block],
                patch_mean_distance=pair.patch_mean_distance[block],
            )
    for index, comparison in enumerate(result.images):
        path = comparison.source.display_path
        for entry in comparison.readouts:
            add(
                kind="readout",
                image_label=letter(index),
                image_path=path,
                class_index=entry.index,
                label=entry.label,
                dot=entry.dot,
                bias=entry.bias,
                logit=entry.logit,
                model_logit=entry.model_logit,
                probability=entry.probability,
            )
        for readout in comparison.poolings:
            for entry in readout.top:
                add(
                    kind="top",
                    image_label=letter(index),
                    image_path=path,
                    pooling=readout.pooling,
                    model_readout=readout.is_model_own,
                    rank=entry.rank,
                    class_index=entry.index,
                    label=entry.label,
                    logit=entry.logit,
                    probability=entry.probability,
                )
        for other, value in enumerate(result.cls_cosine_matrix[index]):
            add(kind="cls_cosine", image_label=letter(index), image_path=path, other_label=letter(other), value=value)
    if result.patch_matches is not None:
        for patch, (match, cosine) in enumerate(
            zip(result.patch_matches.best_match, result.patch_matches.best_cosine, strict=True), start=1
        ):
            add(kind="patch_match", image_label="A", other_label="B", patch=patch, best_match=match, value=cosine)
    return table_rows


def document(result: CompareResult) -> dict[str, Any]:
    return {
        "weights": result.weights,
        "model_pooling": result.model_pooling,
        "images": [
            {
                "label": letter(index),
                "image": comparison.source.to_json(),
                "top": [vars(entry) for entry in comparison.top],
                "softmax": {"max_logit": comparison.max_logit, "shifted_exp_sum": comparison.shifted_exp_sum},
                "readouts": [
                    {
                        **{key: value for key, value in vars(entry).items() if key != "top_dimensions"},
                        "top_dimensions": [vars(item) for item in entry.top_dimensions],
                    }
                    for entry in comparison.readouts
                ],
                "poolings": [
                    {
                        "pooling": readout.pooling,
                        "description": readout.description,
                        "is_model_own": readout.is_model_own,
                        "top": [vars(entry) for entry in readout.top],
                    }
                    for readout in comparison.poolings
                ],
            }
            for index, comparison in enumerate(result.images)
        ],
        "pairs": [{**vars(pair), "first": letter(pair.first), "second": letter(pair.second)} for pair in result.pairs],
        "differ_tolerance_relative_l2": DIFFER_TOLERANCE,
        "cls_cosine_matrix": result.cls_cosine_matrix,
        "patch_matches": None if result.patch_matches is None else vars(result.patch_matches),
        "checks": {
            "max_abs_error_readout_vs_model_logit": result.readout_error,
            "max_abs_error_own_pooling_vs_model_logits": result.pooling_error,
            "tolerance": SELF_CHECK_TOLERANCE,
        },
    }


def figure(result: CompareResult) -> Any:
    """CLS cosine through the depth for the detailed pairs, the N x N cosine heat map (a diverging map centred on 0:
    cosines run from -1 to 1), and for two images the best-match maps."""
    from matplotlib.ticker import MaxNLocator

    from vitcli import figures

    two = result.patch_matches is not None
    fig, panels = figures.figure(4 if two else 2, size=4.8)
    _depth_panel(panels[0], result)
    _matrix_panel(fig, panels[1], result)
    if two:
        grid, matches = result.grid, result.patch_matches
        best = np.array(matches.best_cosine).reshape(grid.rows, grid.cols)
        mappable = figures.overlay(panels[2], result.images[0].crop, best, "magma", float(best.min()), 1.0)
        figures.draw_grid(panels[2], grid)
        panels[2].set_title("A: cosine of each patch's best match in B", fontsize=10)
        fig.colorbar(mappable, ax=panels[2], shrink=0.7).ax.tick_params(labelsize=9)
        counts = np.bincount(np.array(matches.best_match) - 1, minlength=grid.num_patches).reshape(grid.rows, grid.cols)
        mappable = figures.overlay(
            panels[3], result.images[1].crop, counts, "viridis", 0.0, float(max(counts.max(), 1))
        )
        figures.draw_grid(panels[3], grid)
        panels[3].set_title("B: how many patches of A pick each patch", fontsize=10)
        colorbar = fig.colorbar(mappable, ax=panels[3], shrink=0.7)
        colorbar.ax.tick_params(labelsize=9)
        colorbar.ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    count = len(result.images)
    shown = result.images if count <= NAMED_IN_TITLE else result.images[:2]
    named = ", ".join(f"{letter(index)} = {c.source.display_name}" for index, c in enumerate(shown))
    more = f", ... {count} images (all named in the CSV and JSON)" if len(shown) < count else ""
    figures.title(fig, f"{result.model_name}: {named}{more}", result.weights)
    return fig


def _depth_panel(panel: Any, result: CompareResult) -> None:
    """The detailed pairs' cosines block by block: a line each for the CLS rows and the mean patch rows."""
    from matplotlib.ticker import AutoLocator, MaxNLocator

    panel.xaxis.set_major_locator(MaxNLocator(integer=True))
    panel.yaxis.set_major_locator(AutoLocator())
    panel.tick_params(labelsize=9)
    panel.grid(alpha=0.3)
    for pair in result.pairs:
        line = panel.plot(pair.cls_cosine, marker="o", markersize=3, label=f"{_pair_name(pair)} CLS")[0]
        panel.plot(pair.patch_mean_cosine, linestyle="--", color=line.get_color(), label=f"{_pair_name(pair)} mean")
    panel.set_xlabel("block (0 = rows entering block 1)", fontsize=10)
    panel.set_ylabel("cosine similarity between images", fontsize=10)
    panel.set_title("through the depth: CLS rows (solid), mean patch rows (dashed)", fontsize=10)
    panel.legend(fontsize=9, ncols=2 if len(result.pairs) > 3 else 1)


def _matrix_panel(fig: Any, panel: Any, result: CompareResult) -> None:
    """The N x N heat map: every pair's final similarity, however many images (letters on the axes up to 30)."""
    from matplotlib.ticker import MaxNLocator

    count = len(result.images)
    matrix = np.array(result.cls_cosine_matrix)
    image = panel.imshow(matrix, cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
    if count <= 30:
        panel.set_xticks(range(count), [letter(index) for index in range(count)])
        panel.set_yticks(range(count), [letter(index) for index in range(count)])
    else:  # image numbers (1-based, as --pairs takes them) at readable intervals
        for axis in (panel.xaxis, panel.yaxis):
            axis.set_major_locator(MaxNLocator(nbins=8, integer=True))
            axis.set_major_formatter(lambda value, _: f"{int(value) + 1}")
        panel.set_xlabel("image number", fontsize=10)
    panel.tick_params(labelsize=9 if count <= 16 else 7)
    if count <= 10:
        for row in range(count):
            for col in range(count):
                value = matrix[row, col]
                color = "white" if abs(value) > 0.6 else "black"  # readable on the map's dark ends and pale middle
                panel.text(col, row, f"{value:.2f}", ha="center", va="center", fontsize=9, color=color)
    panel.set_title(f"final CLS rows: cosine, {count} x {count}", fontsize=10)
    colorbar = fig.colorbar(image, ax=panel, shrink=0.7, ticks=[-1, -0.5, 0, 0.5, 1])
    colorbar.set_label("cosine (0: orthogonal)", fontsize=10)
    colorbar.ax.tick_params(labelsize=9)


def summary(result: CompareResult) -> dict[str, Any]:
    pair = result.pairs[0]
    return {
        "compare_images": len(result.images),
        "compare_final_cls_cosine_ab": pair.cls_cosine[-1],
        "compare_first_differing_block_ab": pair.first_differing_block,
        "compare_readout_max_abs_error": max(result.readout_error, result.pooling_error),
    }
