"""The patching figure: both crops, per-block bars of the attention and MLP outputs, the blocks x heads heat map, the
two methods against each other, and one map per block of the residual rows over the patch grid with CLS beside it.

Scores are drawn on colour scales centred on 0 (red: restores CLEAN's metric, blue: pushes away from it). When both
methods ran, maps and bars show activation patching and the attribution estimate is drawn as dots and a scatter.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vitcli.experiments.patch_result import KindScores, PatchResult
from vitcli.grid import PatchGrid

COLUMNS = 6
PANEL_INCHES = 2.4


def _shown(scores: KindScores) -> np.ndarray:
    return scores.activation if scores.activation is not None else scores.attribution


def residual_image(grid: PatchGrid, scores: np.ndarray) -> np.ndarray:
    """One block's token scores as (rows, cols + 2): the patch grid, a blank column, then the prefix tokens (CLS at
    the top) in the last column; NaN where nothing is drawn."""
    image = np.full((grid.rows, grid.cols + 2), np.nan)
    image[:, : grid.cols] = scores[grid.num_prefix :].reshape(grid.rows, grid.cols)
    image[: grid.num_prefix, grid.cols + 1] = scores[: grid.num_prefix]
    return image


def patch_figure(result: PatchResult) -> Any:
    from matplotlib import pyplot as plt

    from vitcli import figures

    kinds = {scores.kind: scores for scores in result.kinds}
    residual = kinds.get("residual")
    blocks = _shown(result.kinds[0]).shape[0]
    map_rows = math.ceil(blocks / COLUMNS) if residual is not None else 0
    fig = plt.figure(figsize=(COLUMNS * PANEL_INCHES + 1.2, (1 + map_rows) * PANEL_INCHES + 1.2), layout="constrained")
    layout = fig.add_gridspec(1 + map_rows, COLUMNS)
    for column, (role, side) in enumerate((("CLEAN", result.clean), ("CORRUPT", result.corrupt))):
        panel = fig.add_subplot(layout[0, column])
        figures.show_crop(panel, side.crop)
        panel.set_xticks([])
        panel.set_yticks([])
        panel.set_title(f"{role}: {side.source.display_name}\nM = {side.m:+.3f}", fontsize=8, parse_math=False)
    sublayers = [kinds[kind] for kind in ("attention", "mlp") if kind in kinds]
    if sublayers:
        _bars(fig.add_subplot(layout[0, 2:4]), sublayers)
    if "heads" in kinds:
        _heads(fig, fig.add_subplot(layout[0, 4]), kinds["heads"])
    if result.pearson is not None:
        _scatter(fig.add_subplot(layout[0, 5]), result)
    if residual is not None:
        _residual_maps(fig, [fig.add_subplot(layout[1 + b // COLUMNS, b % COLUMNS]) for b in range(blocks)], result)
    method = "activation patching" if result.kinds[0].activation is not None else "attribution estimate"
    figures.title(
        fig,
        f"{result.model_name}: {method}, M = "
        + (
            f"logit({result.target}) - logit({result.contrast}); "
            if result.embedding is None
            else f"{result.embedding.unit} ({result.embedding.short}); "
        )
        + "score 1 restores CLEAN's M",
        result.weights,
    )
    return fig


def _residual_maps(fig: Any, panels: list[Any], result: PatchResult) -> None:
    """One map per block on one colour scale set by the patch rows (the prefix rows, often far larger once the CLS
    row carries the answer, would wash them out): the CLS value is printed under its cell, whose colour clips."""
    from matplotlib import colormaps

    from vitcli import figures

    cmap = colormaps[figures.DIVERGING].with_extremes(bad="white")
    grid = result.grid
    scores = _shown(next(scores for scores in result.kinds if scores.kind == "residual"))
    limit = figures.symmetric_limit(scores[:, grid.num_prefix :])
    for block, panel in enumerate(panels):
        image = panel.imshow(
            residual_image(grid, scores[block]), cmap=cmap, vmin=-limit, vmax=limit, interpolation="nearest"
        )
        prefix = f"CLS {scores[block, 0]:+.3f}" if grid.num_prefix == 1 else "prefix"
        panel.set_xticks([grid.cols + 1], [prefix], fontsize=7, ha="right")
        panel.set_yticks([])
        panel.set_title(f"residual entering block {block + 1}", fontsize=8)
    fig.colorbar(image, ax=panels, shrink=0.6, label="score (the patch rows' scale; CLS printed)")


def _bars(panel: Any, sublayers: list[KindScores]) -> None:
    width = 0.8 / len(sublayers)
    for position, scores in enumerate(sublayers):
        values = _shown(scores)
        x = np.arange(1, len(values) + 1) + (position - (len(sublayers) - 1) / 2) * width
        panel.bar(x, values, width, label=scores.kind)
        if scores.activation is not None and scores.attribution is not None:
            marker = "k." if position == 0 else "kx"  # attribution estimates in black, one marker per kind
            panel.plot(x, scores.attribution, marker, markersize=5, label=f"{scores.kind} attribution estimate")
    panel.axhline(0, color="black", linewidth=0.6)
    panel.set_xticks(range(1, len(_shown(sublayers[0])) + 1))
    panel.set_xlabel("block")
    panel.set_ylabel("score")
    panel.set_title("attention and MLP outputs", fontsize=8)
    panel.legend(fontsize=6)


def _heads(fig: Any, panel: Any, heads: KindScores) -> None:
    from vitcli import figures

    image = figures.blocks_map(panel, _shown(heads), fontsize=7)
    panel.set_title("heads (slice of attn.proj's input)", fontsize=8)
    fig.colorbar(image, ax=panel, shrink=0.8)


def _scatter(panel: Any, result: PatchResult) -> None:
    for scores in result.kinds:
        panel.scatter(np.ravel(scores.activation), np.ravel(scores.attribution), s=6, alpha=0.6, label=scores.kind)
    low = min(float(np.min(s.activation)) for s in result.kinds)
    high = max(float(np.max(s.activation)) for s in result.kinds)
    panel.plot([low, high], [low, high], color="gray", linewidth=0.6)
    panel.set_xlabel("activation patching")
    panel.set_ylabel("attribution estimate")
    panel.set_title(f"Pearson {result.pearson:.3f}, Spearman {result.spearman:.3f}", fontsize=8)
    panel.legend(fontsize=6)
