"""`anatomy` results of the weights alone as tables, JSON, CSV and the ViT paper's Figure 7 (left and middle); the
views over images are in anatomy_images (distance, cka) and anatomy_tokens (pca, norms). `present` picks the module.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.console import Group
from rich.table import Table

from vitcli.jobs import Presentation
from vitcli.presentation.common import View, matrix_csv
from vitcli.render import weights_caption

COMPONENT_COLUMNS = 7  # the paper's 28 components: 4 rows of 7
NEIGHBOURS_SHOWN = 5  # rows of the positions table


def present(view: str, result: Any) -> Presentation:
    """The Presentation of one view's result."""
    from vitcli.presentation import anatomy_images, anatomy_tokens

    module = {
        "filters": FiltersView,
        "positions": PositionsView,
        "distance": anatomy_images.DistanceView,
        "cka": anatomy_images.CkaView,
        "pca": anatomy_tokens.PcaView,
        "norms": anatomy_tokens.NormsView,
    }[view]
    return module.presentation(result)


class FiltersView(View):
    """The principal components of the centred patch-embedding filters, drawn as RGB patches."""

    @staticmethod
    def table(result: Any) -> Table:
        shown = Table(
            title=f"patch-embedding filters: {len(result.explained_variance_ratio)} principal components of "
            f"{result.filters} centred filters of {result.values_per_filter} values ({result.patch_size}x"
            f"{result.patch_size} RGB)",
            caption=weights_caption(result.weights),
        )
        for column in ("component", "explained variance", "cumulative", "singular value"):
            shown.add_column(column, justify="right")
        cumulative = np.cumsum(result.explained_variance_ratio)
        for index, (share, total, value) in enumerate(
            zip(result.explained_variance_ratio, cumulative, result.singular_values, strict=True), start=1
        ):
            shown.add_row(str(index), f"{share:.4f}", f"{total:.4f}", f"{value:.4g}")
        return shown

    @staticmethod
    def rows(result: Any) -> list[dict[str, Any]]:
        cumulative = np.cumsum(result.explained_variance_ratio)
        return [
            {
                "component": index,
                "explained_variance_ratio": float(share),
                "cumulative": float(total),
                "singular_value": float(value),
            }
            for index, (share, total, value) in enumerate(
                zip(result.explained_variance_ratio, cumulative, result.singular_values, strict=True), start=1
            )
        ]

    @staticmethod
    def document(result: Any) -> dict[str, Any]:
        return {
            "weights": result.weights,
            "definition": "filters = the D rows of the patch-embedding kernel (3 x p x p values, channel-major), "
            "centred by their mean; components = right singular vectors of that matrix, as RGB patches",
            "filters": result.filters,
            "patch_size": result.patch_size,
            "values_per_filter": result.values_per_filter,
            "explained_variance_ratio": np.asarray(result.explained_variance_ratio).tolist(),
            "singular_values": np.asarray(result.singular_values).tolist(),
            "components": np.asarray(result.components).tolist(),
        }

    @staticmethod
    def figure(result: Any) -> Any:
        """The ViT paper's Figure 7 (left): each component min-max scaled to RGB on its own, 7 per row."""
        from vitcli import figures

        count = len(result.components)
        rows = max(1, -(-count // COMPONENT_COLUMNS))
        fig, panels = figures.figure(COMPONENT_COLUMNS, size=1.1, rows=rows)
        for index, panel in enumerate(panels):
            if index >= count:
                panel.set_axis_off()
                continue
            component = np.asarray(result.components[index]).transpose(1, 2, 0)  # (p, p, 3)
            low, high = component.min(), component.max()
            panel.imshow((component - low) / (high - low if high > low else 1.0), interpolation="nearest")
            panel.set_title(f"{index + 1}: {result.explained_variance_ratio[index]:.1%}", fontsize=6)
        figures.title(fig, f"RGB embedding filters: the first {count} principal components", result.weights)
        return fig

    @staticmethod
    def summary(result: Any) -> dict[str, Any]:
        ratios = np.asarray(result.explained_variance_ratio)
        return {
            "filters_first_component_variance": float(ratios[0]) if len(ratios) else None,
            "filters_explained_variance": float(ratios.sum()),
        }


class PositionsView(View):
    """The cosine similarity of every patch's position embedding with every other's: the paper's grid of maps."""

    @staticmethod
    def has_figure(result: Any) -> bool:
        return result.similarity is not None

    @staticmethod
    def table(result: Any) -> Any:
        grid = result.grid
        shown = Table(
            title=f"position-embedding similarity: cosine between the {grid.num_patches} patches' embeddings "
            f"({grid.rows}x{grid.cols} grid)",
            caption=weights_caption(result.weights),
        )
        if result.similarity is None:
            shown.add_column("no position-embedding similarity")
            shown.add_row(result.reason)
            return shown
        for column in ("grid distance", "pairs", "mean cosine", "min", "max"):
            shown.add_column(column, justify="right")
        for line in PositionsView.by_distance(result):
            shown.add_row(
                str(line["grid_distance"]),
                str(line["pairs"]),
                f"{line['mean_cosine']:.4f}",
                f"{line['min_cosine']:.4f}",
                f"{line['max_cosine']:.4f}",
            )
        return Group(shown, result.prefix + (" (a fixed table, not trained)" if result.fixed else ""))

    @staticmethod
    def by_distance(result: Any) -> list[dict[str, Any]]:
        """The similarity by Chebyshev grid distance (0 is the diagonal): how it falls with distance."""
        grid = result.grid
        rows, cols = np.divmod(np.arange(grid.num_patches), grid.cols)
        distance = np.maximum(abs(rows[:, None] - rows[None, :]), abs(cols[:, None] - cols[None, :]))
        lines = []
        for step in range(int(distance.max()) + 1):
            values = result.similarity[distance == step]
            lines.append(
                {
                    "grid_distance": step,
                    "pairs": int(values.size),
                    "mean_cosine": float(values.mean()),
                    "min_cosine": float(values.min()),
                    "max_cosine": float(values.max()),
                }
            )
        return lines

    @staticmethod
    def rows(result: Any) -> list[dict[str, Any]]:
        """One row per patch: its place, its similarity to its 4-neighbours and to the farthest patches."""
        if result.similarity is None:
            return [{"reason": result.reason}]
        grid = result.grid
        lines = []
        for index in range(grid.num_patches):
            row, col = divmod(index, grid.cols)
            similarity = result.patch_map(index + 1)
            near = [
                similarity[r, c]
                for r, c in ((row - 1, col), (row + 1, col), (row, col - 1), (row, col + 1))
                if 0 <= r < grid.rows and 0 <= c < grid.cols
            ]
            others = np.where(np.arange(grid.num_patches) == index, -np.inf, result.similarity[index])
            lines.append(
                {
                    "patch": index + 1,
                    "row": row,
                    "col": col,
                    "self": float(similarity[row, col]),
                    "neighbours_mean": float(np.mean(near)) if near else None,
                    "most_similar_other": int(np.argmax(others)) + 1 if grid.num_patches > 1 else None,
                    "most_similar_cosine": float(others.max()) if grid.num_patches > 1 else None,
                }
            )
        return lines

    @staticmethod
    def document(result: Any) -> dict[str, Any]:
        grid = result.grid
        body: dict[str, Any] = {
            "weights": result.weights,
            "definition": "similarity[i][j] = cosine of the position embeddings of patches P(i+1) and P(j+1), patches "
            "row by row",
            "grid": {"rows": grid.rows, "cols": grid.cols, "patches": grid.num_patches},
            "prefix_tokens": result.prefix,
            "fixed": result.fixed,
            "reason": result.reason,
        }
        if result.similarity is not None:
            body["by_grid_distance"] = PositionsView.by_distance(result)
            body["similarity"] = np.asarray(result.similarity).tolist()
        return body

    @staticmethod
    def extra_files(result: Any) -> dict[str, Any]:
        return {} if result.similarity is None else {"similarity.csv": matrix_csv(result.similarity)}

    @staticmethod
    def figure(result: Any) -> Any:
        """The ViT paper's Figure 7 (middle): at each patch's place in the grid, its similarity map, all on one
        scale from -1 to 1, drawn as one mosaic (one image however large the grid)."""
        import matplotlib.pyplot as plt

        grid = result.grid
        rows, cols = grid.rows, grid.cols
        mosaic = np.full((rows * (rows + 1), cols * (cols + 1)), np.nan)
        for index in range(grid.num_patches):
            row, col = divmod(index, cols)
            top, left = row * (rows + 1), col * (cols + 1)
            mosaic[top : top + rows, left : left + cols] = result.patch_map(index + 1)
        from vitcli import figures

        fig, (panel,) = figures.figure(1, size=7.0)
        cmap = plt.get_cmap("viridis").with_extremes(bad="white")
        image = panel.imshow(mosaic, cmap=cmap, vmin=-1, vmax=1, interpolation="nearest")
        panel.set_xlabel("input patch column (zero-based, as r4c6)")
        panel.set_ylabel("input patch row (zero-based)")
        panel.set_xticks([col * (cols + 1) + cols / 2 for col in range(cols)], [str(c) for c in range(cols)])
        panel.set_yticks([row * (rows + 1) + rows / 2 for row in range(rows)], [str(r) for r in range(rows)])
        panel.tick_params(labelsize=max(3, min(8, 120 // max(rows, cols))))
        fig.colorbar(image, ax=panel, shrink=0.7, label="cosine similarity")
        figures.title(fig, "position embedding similarity", result.weights)
        return fig

    @staticmethod
    def summary(result: Any) -> dict[str, Any]:
        if result.similarity is None:
            return {"positions_learned": False}
        lines = PositionsView.by_distance(result)
        return {
            "positions_neighbour_cosine": lines[1]["mean_cosine"] if len(lines) > 1 else None,
            "positions_farthest_cosine": lines[-1]["mean_cosine"],
        }
