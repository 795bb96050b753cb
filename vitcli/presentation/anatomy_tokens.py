"""`anatomy` views of tokens over a set of images: the last block's patch features to RGB with the first component's
foreground mask (DINO), and tokens of outlying norm (Darcet et al. 2024, "Vision Transformers Need Registers")."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from vitcli.filenames import escaped_path
from vitcli.presentation.anatomy_images import image_names, images_caption, images_figure_note
from vitcli.presentation.common import View

IMAGES_DRAWN = 16  # the PCA figure shows the first images; every image's map is in the CSV and rgb.npy
OUTLIERS_SHOWN = 20  # rows of the norms table; all are in the CSV and JSON
BLOCK_COLUMNS = 4  # the norms figure: one histogram per block, this many per row


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(array), allow_pickle=False)
    return buffer.getvalue()


class PcaView(View):
    """The first three principal components of the last block's patch features over the images, as RGB per image."""

    @staticmethod
    def table(result: Any) -> Any:
        shown = Table(
            title=f"PCA of patch features over {len(result.sources)} images: components 1-3 as RGB",
            caption=images_caption(result),
        )
        shown.add_column("image")
        shown.add_column(f"foreground patches (component 1 > {result.threshold:g})", justify="right")
        shown.add_column("share", justify="right")
        patches = result.grid.num_patches
        for source, mask in zip(result.sources, result.mask, strict=True):
            count = int(mask.sum())
            shown.add_row(Text(escaped_path(source.path)), f"{count} of {patches}", f"{count / patches:.3f}")
        ratios = ", ".join(f"{ratio:.4f}" for ratio in result.explained_variance_ratio)
        return Group(shown, Text(f"explained variance of components 1-3: {ratios}; features: {result.features}"))

    @staticmethod
    def rows(result: Any) -> list[dict[str, Any]]:
        """One row per image and patch: its RGB (components 1-3 scaled over the images) and whether it is foreground."""
        cols = result.grid.cols
        lines = []
        for index, source in enumerate(result.sources):
            path = escaped_path(source.path)
            for patch in range(result.grid.num_patches):
                row, col = divmod(patch, cols)
                red, green, blue = (float(value) for value in result.rgb[index, row, col])
                lines.append(
                    {
                        "source_image": path,
                        "patch": patch + 1,
                        "row": row,
                        "col": col,
                        "red": red,
                        "green": green,
                        "blue": blue,
                        "foreground": bool(result.mask[index, row, col]),
                    }
                )
        return lines

    @staticmethod
    def document(result: Any) -> dict[str, Any]:
        return {
            "definition": "components = the first 3 principal axes of every image's patch features together; each "
            "patch's projections min-max scaled over the images give red, green, blue; foreground = red > threshold",
            "features": result.features,
            "threshold": result.threshold,
            "explained_variance_ratio": np.asarray(result.explained_variance_ratio).tolist(),
            "images": image_names(result.sources),
            "foreground_patches": [int(mask.sum()) for mask in result.mask],
            "arrays": "rgb.npy (images, rows, cols, 3) and mask.npy (images, rows, cols) beside this file",
        }

    @staticmethod
    def extra_files(result: Any) -> dict[str, Any]:
        return {"rgb.npy": _npy(result.rgb.astype(np.float32)), "mask.npy": _npy(result.mask.astype(bool))}

    @staticmethod
    def figure(result: Any) -> Any:
        """Per image (the first IMAGES_DRAWN): the RGB map, and the map with the background (mask off) in black."""
        from vitcli import figures

        count = min(len(result.sources), IMAGES_DRAWN)
        columns = min(count, 4)
        rows = -(-count // columns)
        fig, panels = figures.figure(columns * 2, size=1.6, rows=rows)
        for index, panel in enumerate(panels):
            image = index // 2
            if image >= count:
                panel.set_axis_off()
                continue
            rgb = result.rgb[image]
            if index % 2:
                rgb = np.where(result.mask[image][..., None], rgb, 0.0)
            panel.imshow(rgb, interpolation="nearest")
            name = escaped_path(result.sources[image].path.name)
            panel.set_title(name if index % 2 == 0 else "foreground", fontsize=6, parse_math=False)
        shown = f"the first {count} of {len(result.sources)}" if count < len(result.sources) else f"{count}"
        title = f"PCA of patch features to RGB, {shown} images; foreground: component 1 > {result.threshold:g}"
        fig.suptitle(f"{title}\n{images_figure_note(result)}", fontsize=10, parse_math=False)
        return fig

    @staticmethod
    def summary(result: Any) -> dict[str, Any]:
        return {
            "pca_foreground_share": float(result.mask.mean()),
            "pca_first_component_variance": float(result.explained_variance_ratio[0]),
        }


class NormsView(View):
    """The norm of every token's row leaving every block, and the tokens far above their block's median."""

    @staticmethod
    def table(result: Any) -> Any:
        blocks = Table(
            title=f"token norms over {len(result.sources)} images: outliers above {result.factor:g} x the block's "
            "median",
            caption=images_caption(result),
        )
        for column in ("block", "median", "max", "outliers"):
            blocks.add_column(column, justify="right")
        counts = np.bincount([outlier.block for outlier in result.outliers], minlength=len(result.medians) + 1)
        for block, median in enumerate(result.medians, start=1):
            blocks.add_row(
                str(block), f"{median:.4g}", f"{result.norms[:, block - 1].max():.4g}", str(int(counts[block]))
            )
        parts: list[Any] = [blocks]
        if result.outliers:
            listed = Table(title=f"outlier tokens (the {min(len(result.outliers), OUTLIERS_SHOWN)} largest ratios)")
            for column in ("image", "token", "row", "col", "block", "norm", "x median", "CLS attention"):
                listed.add_column(column, justify="left" if column in ("image", "token") else "right")
            for line in sorted(NormsView.rows(result), key=lambda line: -line["ratio"])[:OUTLIERS_SHOWN]:
                listed.add_row(
                    Text(line["source_image"]),
                    line["token"],
                    "" if line["row"] is None else str(line["row"]),
                    "" if line["col"] is None else str(line["col"]),
                    str(line["block"]),
                    f"{line['norm']:.4g}",
                    f"{line['ratio']:.2f}",
                    "" if line["cls_attention"] is None else f"{line['cls_attention']:.4f}",
                )
            parts.append(listed)
        else:
            parts.append(Text(f"no token exceeds {result.factor:g} x its block's median"))
        parts.append(Text(result.note))
        return Group(*parts)

    @staticmethod
    def rows(result: Any) -> list[dict[str, Any]]:
        """One row per outlier: image, token and its grid place (zero-based; none for prefix tokens), block, norm."""
        prefix = len(result.grid.prefix_names)
        lines = []
        for outlier in result.outliers:
            row, col = divmod(outlier.token - prefix, result.grid.cols) if outlier.token >= prefix else (None, None)
            lines.append(
                {
                    "source_image": escaped_path(result.sources[outlier.image].path),
                    "token": outlier.name,
                    "token_index": outlier.token,
                    "row": row,
                    "col": col,
                    "block": outlier.block,
                    "norm": outlier.norm,
                    "median": outlier.median,
                    "ratio": outlier.norm / outlier.median if outlier.median else None,
                    "cls_attention": outlier.cls_attention,
                }
            )
        return lines

    @staticmethod
    def document(result: Any) -> dict[str, Any]:
        quantiles = np.quantile(
            result.norms.transpose(1, 0, 2).reshape(len(result.medians), -1), [0, 0.5, 0.99, 1], axis=1
        )
        return {
            "definition": result.note,
            "factor": result.factor,
            "images": image_names(result.sources),
            "medians": np.asarray(result.medians).tolist(),
            "per_block": [
                {"block": block + 1, "min": float(low), "median": float(mid), "q99": float(high), "max": float(top)}
                for block, (low, mid, high, top) in enumerate(quantiles.T)
            ],
            "outliers": NormsView.rows(result),
        }

    @staticmethod
    def figure(result: Any) -> Any:
        """Per block, the histogram of every token's norm (log counts) with the outlier line at factor x median:
        the registers paper's Figure 3, block by block."""
        import matplotlib.pyplot as plt

        blocks = len(result.medians)
        columns = min(blocks, BLOCK_COLUMNS)
        rows = -(-blocks // columns)
        fig, axes = plt.subplots(rows, columns, figsize=(2.3 * columns, 1.9 * rows + 0.6), squeeze=False)
        fig.set_layout_engine("constrained")
        for index, panel in enumerate(axes.ravel()):
            if index >= blocks:
                panel.set_axis_off()
                continue
            values = result.norms[:, index].ravel()
            panel.hist(values, bins=50, color="steelblue", log=True)
            panel.axvline(result.factor * result.medians[index], color="crimson", linestyle="--", linewidth=1)
            panel.set_title(f"block {index + 1}", fontsize=7)
            panel.tick_params(labelsize=5)
        title = f"token norms per block over {len(result.sources)} images; dashed: {result.factor:g} x median"
        fig.suptitle(f"{title}\n{images_figure_note(result)}", fontsize=10, parse_math=False)
        return fig

    @staticmethod
    def summary(result: Any) -> dict[str, Any]:
        return {
            "norms_outliers": len(result.outliers),
            "norms_outlier_images": len({outlier.image for outlier in result.outliers}),
        }
