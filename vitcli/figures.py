"""Figure building blocks shared by every command: the crop the model saw, its patch grid, and maps over it.

matplotlib is imported here only (Agg backend, no display needed); commands import this module lazily.
"""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from vitcli.grid import PatchGrid  # noqa: E402
from vitcli.render import weights_note  # noqa: E402


def figure(columns: int = 1, size: float = 5.0, rows: int = 1) -> tuple[Any, list[Any]]:
    """rows x columns square panels without ticks, listed row by row, room left for titles and a colour bar."""
    fig, axes = plt.subplots(
        rows, columns, figsize=(size * columns + 1.2, size * rows + 0.9), squeeze=False, layout="constrained"
    )
    panels = [panel for line in axes for panel in line]
    for panel in panels:
        panel.set_xticks([])
        panel.set_yticks([])
    return fig, panels


def show_crop(panel: Any, crop: np.ndarray) -> None:
    """The (H, W, 3) uint8 crop, pixel-exact: pixel (x, y) covers [x, x+1) x [y, y+1)."""
    height, width = crop.shape[:2]
    panel.imshow(crop, extent=(0, width, height, 0), interpolation="nearest")


def draw_grid(panel: Any, grid: PatchGrid, numbers: bool = False, color: str = "white") -> None:
    size = grid.patch_size
    for line in range(grid.cols + 1):
        panel.axvline(line * size, color=color, linewidth=0.5, alpha=0.7)
    for line in range(grid.rows + 1):
        panel.axhline(line * size, color=color, linewidth=0.5, alpha=0.7)
    if numbers:
        fontsize = max(2.5, min(7.0, 110.0 / max(grid.rows, grid.cols)))
        for patch in range(1, grid.num_patches + 1):
            left, top, right, bottom = grid.pixel_box(patch)
            panel.text(
                (left + right) / 2,
                (top + bottom) / 2,
                str(patch),
                ha="center",
                va="center",
                fontsize=fontsize,
                color="white",
                bbox={"facecolor": "black", "alpha": 0.45, "pad": 0.5, "linewidth": 0},
            )


def outline(panel: Any, box: tuple[int, int, int, int], color: str = "cyan", width: float = 2.0) -> None:
    """Outline a (left, top, right, bottom) pixel box."""
    left, top, right, bottom = box
    panel.add_patch(Rectangle((left, top), right - left, bottom - top, fill=False, edgecolor=color, linewidth=width))


def overlay(
    panel: Any,
    crop: np.ndarray,
    values: np.ndarray,
    cmap: str,
    vmin: float,
    vmax: float,
    alpha: float = 0.6,
) -> Any:
    """The crop with a (rows, cols) map drawn over it, one cell per patch; returns the mappable for a colour bar."""
    height, width = crop.shape[:2]
    show_crop(panel, crop)
    return panel.imshow(
        values, extent=(0, width, height, 0), cmap=cmap, vmin=vmin, vmax=vmax, alpha=alpha, interpolation="nearest"
    )


def title(fig: Any, text: str, weights: str) -> None:
    """A figure title that always names the weights. Drawn as written: a title holds file names and labels, and
    matplotlib would read `cost $5 and $6` as maths (every text from a user gets parse_math=False)."""
    fig.suptitle(f"{text}\n{weights_note(weights)}", fontsize=10, parse_math=False)


DIVERGING = "RdBu_r"  # red above 0, blue below, white at 0


def symmetric_limit(*arrays: Any) -> float:
    """The half range of a colour scale centred on 0: the largest |value| (NaN ignored), 1 when every value is 0."""
    largest = max(float(np.nanmax(np.abs(np.asarray(array, dtype=float)))) for array in arrays)
    return largest if largest > 0 else 1.0


def blocks_map(
    panel: Any,
    values: np.ndarray,
    columns: str = "head",
    ticks: list[str] | None = None,
    limit: float | None = None,
    fontsize: float | None = None,
) -> Any:
    """A blocks x `columns` map (heads by default, ticks counting from 1) on a colour scale centred on 0, +-limit
    (default: symmetric_limit), NaN cells gray; returns the image for a colour bar."""
    blocks, count = values.shape
    limit = symmetric_limit(values) if limit is None else limit
    cmap = plt.get_cmap(DIVERGING).with_extremes(bad="lightgray")
    image = panel.imshow(values, cmap=cmap, vmin=-limit, vmax=limit, aspect="auto", interpolation="nearest")
    panel.set_xticks(range(count), ticks or [str(column) for column in range(1, count + 1)], fontsize=fontsize)
    panel.set_yticks(range(blocks), [str(block) for block in range(1, blocks + 1)], fontsize=fontsize)
    panel.set_xlabel(columns)
    panel.set_ylabel("block")
    return image
