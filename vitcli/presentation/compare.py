"""Compare results as tables, long-form rows, JSON, a figure and summary numbers."""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from rich.console import Group
from rich.table import Table

from vitcli.experiments.compare import DIFFER_TOLERANCE, POOLINGS, SELF_CHECK_TOLERANCE, CompareResult, PairTrajectory
from vitcli.render import weights_caption

MATCHES_SHOWN = 8


def letter(index: int) -> str:
    """Images are called A, B, C ... in tables and figures (then I27, I28 ...)."""
    return string.ascii_uppercase[index] if index < 26 else f"I{index + 1}"


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
            letter(index), str(comparison.source.path), str(best.index), best.label, f"{best.probability:.6f}"
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
        title=f"{letter(index)} ({comparison.source.path.name}): classifier readout logit = w_c . h + b_c",
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
    matrix = Table(title="cosine similarity of the final (normalized) CLS rows")
    matrix.add_column("")
    for index in range(len(result.images)):
        matrix.add_column(letter(index), justify="right")
    for index, line in enumerate(result.cls_cosine_matrix):
        matrix.add_row(letter(index), *(f"{value:.4f}" for value in line))
    return matrix


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
        path = str(comparison.source.path)
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
        "pairs": [{"first": letter(pair.first), "second": letter(pair.second), **vars(pair)} for pair in result.pairs],
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
    """CLS cosine through the depth, the N x N cosine matrix, and for two images the best-match maps."""
    from matplotlib.ticker import AutoLocator, MaxNLocator

    from vitcli import figures

    two = result.patch_matches is not None
    fig, panels = figures.figure(4 if two else 2, size=4.2)
    depth_panel, matrix_panel = panels[0], panels[1]
    depth_panel.xaxis.set_major_locator(MaxNLocator(integer=True))
    depth_panel.yaxis.set_major_locator(AutoLocator())
    depth_panel.grid(alpha=0.3)
    for pair in result.pairs:
        line = depth_panel.plot(pair.cls_cosine, marker="o", markersize=3, label=f"{_pair_name(pair)} CLS")[0]
        depth_panel.plot(
            pair.patch_mean_cosine, linestyle="--", color=line.get_color(), label=f"{_pair_name(pair)} mean"
        )
    depth_panel.set_xlabel("block (0 = rows entering block 1)")
    depth_panel.set_ylabel("cosine similarity between images")
    depth_panel.legend(fontsize=7)
    count = len(result.images)
    image = matrix_panel.imshow(np.array(result.cls_cosine_matrix), cmap="viridis", vmin=-1, vmax=1)
    matrix_panel.set_xticks(range(count), [letter(index) for index in range(count)])
    matrix_panel.set_yticks(range(count), [letter(index) for index in range(count)])
    if count <= 10:
        for row in range(count):
            for col in range(count):
                value = result.cls_cosine_matrix[row][col]
                color = "black" if value > 0.3 else "white"  # readable on viridis' yellow and on its purple
                matrix_panel.text(col, row, f"{value:.2f}", ha="center", va="center", fontsize=8, color=color)
    matrix_panel.set_title("final CLS rows: cosine", fontsize=9)
    fig.colorbar(image, ax=matrix_panel, shrink=0.7)
    if two:
        grid, matches = result.grid, result.patch_matches
        best = np.array(matches.best_cosine).reshape(grid.rows, grid.cols)
        mappable = figures.overlay(panels[2], result.images[0].crop, best, "magma", float(best.min()), 1.0)
        figures.draw_grid(panels[2], grid)
        panels[2].set_title("A: cosine of each patch's best match in B", fontsize=9)
        fig.colorbar(mappable, ax=panels[2], shrink=0.7)
        counts = np.bincount(np.array(matches.best_match) - 1, minlength=grid.num_patches).reshape(grid.rows, grid.cols)
        mappable = figures.overlay(
            panels[3], result.images[1].crop, counts, "viridis", 0.0, float(max(counts.max(), 1))
        )
        figures.draw_grid(panels[3], grid)
        panels[3].set_title("B: how many patches of A pick each patch", fontsize=9)
        fig.colorbar(mappable, ax=panels[3], shrink=0.7)
    names = ", ".join(f"{letter(index)} = {c.source.path.name}" for index, c in enumerate(result.images))
    figures.title(fig, f"{result.model_name}: {names}", result.weights)
    return fig


def summary(result: CompareResult) -> dict[str, Any]:
    pair = result.pairs[0]
    return {
        "compare_images": len(result.images),
        "compare_final_cls_cosine_ab": pair.cls_cosine[-1],
        "compare_first_differing_block_ab": pair.first_differing_block,
        "compare_readout_max_abs_error": max(result.readout_error, result.pooling_error),
    }
