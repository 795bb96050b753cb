"""`anatomy` over a set of images: mean attention distance per head against depth (the ViT paper's Figure 7, right)
and linear CKA between blocks as a heat map (Raghu et al. 2021)."""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from vitcli.filenames import escaped_path
from vitcli.output import counted
from vitcli.presentation.common import View, matrix_csv
from vitcli.render import is_random, weights_caption

# The results over images carry no weights label: the provenance holds it; a caption says "see the provenance".
NO_LABEL = "weights: see the provenance"


def images_caption(result: Any) -> str | Text:
    """The caption under a table of a result over images (pca and norms use it too): weights, images left out."""
    weights = getattr(result, "weights", None)
    caption = weights_caption(weights) if weights else NO_LABEL
    skipped = getattr(result, "skipped", [])
    if skipped:  # said under every view's table, so nobody reads the numbers as covering every image given
        more = " ..." if len(skipped) > 1 else ""
        caption = Text.assemble(
            caption, f"\nleft out {counted(len(skipped), 'image')} that cannot be read: {skipped[0]}{more}"
        )
    return caption


def image_names(sources: list[Any]) -> list[str]:
    return [escaped_path(source.path) for source in sources]


class DistanceView(View):
    """Mean attention distance (pixels) of every head of every block, averaged over query patches and images."""

    @staticmethod
    def table(result: Any) -> Any:
        blocks, heads = result.mean.shape
        shown = Table(
            title=f"mean attention distance in pixels over {len(result.sources)} images (patch {result.grid.patch_size}"
            f", {result.grid.rows}x{result.grid.cols} grid)",
            caption=images_caption(result),
        )
        shown.add_column("block", justify="right")
        for head in range(1, heads + 1):
            shown.add_column(f"head {head}", justify="right")
        shown.add_column("mean", justify="right")
        for block in range(blocks):
            shown.add_row(
                str(block + 1), *(f"{value:.1f}" for value in result.mean[block]), f"{result.mean[block].mean():.1f}"
            )
        return Group(shown, Text(result.note))

    @staticmethod
    def rows(result: Any) -> list[dict[str, Any]]:
        """One row per block and head: the mean over images, and its spread over images."""
        blocks, heads = result.mean.shape
        return [
            {
                "block": block + 1,
                "head": head + 1,
                "mean_distance_pixels": float(result.mean[block, head]),
                "std_over_images": float(result.per_image[:, block, head].std()),
                "min_over_images": float(result.per_image[:, block, head].min()),
                "max_over_images": float(result.per_image[:, block, head].max()),
            }
            for block in range(blocks)
            for head in range(heads)
        ]

    @staticmethod
    def document(result: Any) -> dict[str, Any]:
        grid = result.grid
        return {
            "definition": result.note,
            "renormalized": result.renormalized,
            "unit": "pixels of the model input",
            "grid": {"rows": grid.rows, "cols": grid.cols, "patch_size": grid.patch_size},
            "images": image_names(result.sources),
            "mean": np.asarray(result.mean).tolist(),
            "per_image": np.asarray(result.per_image).tolist(),
        }

    @staticmethod
    def figure(result: Any) -> Any:
        """Each head's mean distance against the block's depth, one dot per head (the paper's Figure 7, right)."""
        import matplotlib.pyplot as plt

        blocks, heads = result.mean.shape
        fig, panel = plt.subplots(figsize=(5.5, 4.2), layout="constrained")
        colours = plt.get_cmap("tab20" if heads > 10 else "tab10")
        for head in range(heads):
            panel.scatter(
                np.arange(1, blocks + 1), result.mean[:, head], s=14, color=colours(head % colours.N),
                label=f"head {head + 1}",
            )  # fmt: skip
        panel.set_xlabel("network depth (block)")
        panel.set_ylabel("mean attention distance (pixels)")
        panel.set_xticks(range(1, blocks + 1))
        side = max(result.grid.rows, result.grid.cols) * result.grid.patch_size
        panel.set_ylim(0, side)
        if heads <= 16:
            panel.legend(fontsize=6, ncol=2, loc="lower right")
        title = f"mean attention distance over {len(result.sources)} images"
        fig.suptitle(f"{title}\n{images_figure_note(result)}", fontsize=10, parse_math=False)
        return fig

    @staticmethod
    def summary(result: Any) -> dict[str, Any]:
        return {
            "distance_first_block_mean": float(result.mean[0].mean()),
            "distance_last_block_mean": float(result.mean[-1].mean()),
            "distance_images": len(result.sources),
        }


class CkaView(View):
    """Linear CKA between the residual streams leaving every pair of blocks."""

    @staticmethod
    def table(result: Any) -> Any:
        blocks = result.matrix.shape[0]
        shown = Table(title=f"linear CKA between blocks over {result.used} images", caption=images_caption(result))
        shown.add_column("block", justify="right")
        for block in range(1, blocks + 1):
            shown.add_column(str(block), justify="right")
        for block in range(blocks):
            shown.add_row(str(block + 1), *(f"{value:.3f}" for value in result.matrix[block]))
        return Group(shown, Text(f"{result.estimator}; one example = {result.example}"))

    @staticmethod
    def rows(result: Any) -> list[dict[str, Any]]:
        blocks = result.matrix.shape[0]
        return [
            {"block_a": first + 1, "block_b": second + 1, "cka": float(result.matrix[first, second])}
            for first in range(blocks)
            for second in range(blocks)
        ]

    @staticmethod
    def document(result: Any) -> dict[str, Any]:
        return {
            "definition": "linear CKA = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)), K and L the Gram matrices of two "
            "blocks' outputs over the images (Kornblith et al. 2019)",
            "estimator": result.estimator,
            "example": result.example,
            "images": result.images,
            "used": result.used,
            "minibatch": result.minibatch,
            "minibatches": result.minibatches,
            "matrix": np.asarray(result.matrix).tolist(),
        }

    @staticmethod
    def extra_files(result: Any) -> dict[str, Any]:
        return {"matrix.csv": matrix_csv(result.matrix)}

    @staticmethod
    def figure(result: Any) -> Any:
        import matplotlib.pyplot as plt

        blocks = result.matrix.shape[0]
        fig, panel = plt.subplots(figsize=(5.2, 4.6), layout="constrained")
        image = panel.imshow(result.matrix, cmap="magma", vmin=0, vmax=1, origin="lower", interpolation="nearest")
        ticks = range(blocks)
        panel.set_xticks(ticks, [str(block + 1) for block in ticks], fontsize=7)
        panel.set_yticks(ticks, [str(block + 1) for block in ticks], fontsize=7)
        panel.set_xlabel("block")
        panel.set_ylabel("block")
        fig.colorbar(image, ax=panel, shrink=0.8, label="linear CKA")
        fig.suptitle(
            f"CKA between blocks over {result.used} images\n{images_figure_note(result)}", fontsize=10, parse_math=False
        )
        return fig

    @staticmethod
    def summary(result: Any) -> dict[str, Any]:
        blocks = result.matrix.shape[0]
        neighbours = [result.matrix[block, block + 1] for block in range(blocks - 1)]
        return {
            "cka_first_last": float(result.matrix[0, -1]),
            "cka_neighbours_mean": float(np.mean(neighbours)) if neighbours else None,
            "cka_images": result.used,
        }


def images_figure_note(result: Any) -> str:
    weights = getattr(result, "weights", None)
    if weights:
        return f"{weights} WEIGHTS: untrained model" if is_random(weights) else f"weights: {weights}"
    return NO_LABEL
