"""The attention explorer (`Exploration`) as a table, CSV rows, JSON, a summary and one self-contained HTML page; and
how another page embeds it (`explorer_fragment`, from explorer_frame.py, light enough for `vitcli report`).

The page holds its data inline (the crop as PNG, the attention as base64 float16, a JSON header) and its script and
style inline: it opens from a file or an e-mail with no network. Its numbers are the float16 values of exactly the
attention `vitcli attend` prints (within `PRECISION`); nothing is recomputed here but means over queries for the table.
"""

from __future__ import annotations

import base64
import html
import io
import json
from typing import Any

import numpy as np
from rich.table import Table
from rich.text import Text
from torch import Tensor

from vitcli.experiments.explore import PRECISION, Exploration
from vitcli.presentation.attention import grid_json, self_check_json
from vitcli.presentation.explore_page import PAGE
from vitcli.presentation.explorer_frame import explorer_fragment, is_explorer_page  # noqa: F401 (public here too)
from vitcli.render import is_random, weights_caption

LAYOUT = "blocks x heads x query token x source token, row-major, little-endian"
ROLLOUT_WHAT = "attention rollout through every block: heads averaged, identity added, rows renormalized"


def table(result: Exploration) -> Table:
    stored = result.stored_error()
    explorer = Table(
        title=f"attention explorer: {len(result.blocks)} blocks x {result.heads} heads x "
        f"{result.grid.num_tokens} x {result.grid.num_tokens}\n{result.source.display_path}",
        caption=Text.assemble(
            f"{PRECISION}; largest |stored - exact| measured {stored['attention']:.2g}\n"
            "open the .html file in a browser: click a patch, move with the arrow keys\n",
            weights_caption(result.weights),
        ),
    )
    for column in ("block", "head", "mean CLS attention %", "mean self attention %", "largest weight %"):
        explorer.add_column(column, justify="right")
    for row in rows(result):
        explorer.add_row(
            str(row["block"]),
            str(row["head"]),
            f"{100 * row['mean_cls_attention']:.2f}",
            f"{100 * row['mean_self_attention']:.2f}",
            f"{100 * row['largest_attention']:.2f}",
        )
    return explorer


def rows(result: Exploration) -> list[dict[str, Any]]:
    """One row per block and head: the mean over all queries of the CLS column and of the diagonal, the largest
    weight, and the largest |float16 - exact| stored for it."""
    exact = result.attention.numpy()
    stored = np.abs(exact.astype(np.float16).astype(np.float32) - exact).max(axis=(2, 3))
    cls = exact[..., 0].astype(np.float64).mean(axis=-1)
    diagonal = np.diagonal(exact, axis1=2, axis2=3).astype(np.float64).mean(axis=-1)
    largest = exact.max(axis=(2, 3))
    return [
        {
            "block": block,
            "head": head + 1,
            "mean_cls_attention": float(cls[index, head]),
            "mean_self_attention": float(diagonal[index, head]),
            "largest_attention": float(largest[index, head]),
            "largest_stored_error": float(stored[index, head]),
        }
        for index, block in enumerate(result.blocks)
        for head in range(result.heads)
    ]


def document(result: Exploration) -> dict[str, Any]:
    return {
        "weights": result.weights,
        "model": result.model,
        "grid": grid_json(result.grid),
        "blocks": result.blocks,
        "heads": result.heads,
        "stored": {
            "dtype": "float16",
            "layout": LAYOUT,
            "precision": PRECISION,
            "largest_error": result.stored_error(),
        },
        "rollout": ROLLOUT_WHAT,
        "self_check": self_check_json(result.self_check),
        "by_block_and_head": rows(result),
        "explain_maps": [item["method"] for item in _maps_json(result.explanation)],
    }


def summary(result: Exploration) -> dict[str, Any]:
    return {
        "explore_blocks": len(result.blocks),
        "explore_heads": result.heads,
        "explore_stored_error_max": result.stored_error()["attention"],
        "explore_self_check_max": max(result.self_check.values()),
    }


# ----- the page


def page(result: Exploration) -> str:
    """The explorer as one self-contained HTML document."""
    header = {
        "image": result.source.display_name,
        "model": result.model,
        "weights": result.weights,
        "random": is_random(result.weights),
        "grid": grid_json(result.grid),
        "prefix": list(result.grid.prefix_names),
        "blocks": result.blocks,
        "heads": result.heads,
        "precision": PRECISION,
        "stored_error": result.stored_error(),
        "self_check_max": max(result.self_check.values()),
        "rollout": ROLLOUT_WHAT,
        "depth": len(result.self_check),
        "colormap": colormap_hex("inferno"),
        "maps": _maps_json(result.explanation),
    }
    return PAGE.substitute(
        title=html.escape(f"attention explorer: {result.source.display_name}"),
        header=_script_json(header),
        crop=_png_data_uri(result.crop),
        attention=_float16_base64(result.attention),
        rollout=_float16_base64(result.rollout),
    )


def _maps_json(explanation: Any) -> list[dict[str, Any]]:
    """explain's maps as the page shows them: raw values per patch, row by row (null where undefined)."""
    if explanation is None:
        return []
    target = explanation.target
    return [
        {
            "method": item.method,
            "unit": item.unit,
            "definition": item.definition,
            "target": f"{target.index} {target.label.split(',')[0]}",
            "values": [None if np.isnan(value) else float(value) for value in item.values.ravel()],
        }
        for item in explanation.maps
    ]


def _float16_base64(values: Tensor) -> str:
    return base64.b64encode(values.half().numpy().astype("<f2").tobytes()).decode("ascii")


def _png_data_uri(crop: np.ndarray) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(crop).save(buffer, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _script_json(value: Any) -> str:
    """JSON that cannot end its <script> element early, whatever the file name holds."""
    return json.dumps(value, ensure_ascii=True).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def colormap_hex(name: str) -> str:
    """The colour map's 256 colours as one string of 6-digit hex codes (the page's colour scale)."""
    import matplotlib

    colours = (matplotlib.colormaps[name](np.linspace(0.0, 1.0, 256))[:, :3] * 255).round().astype(np.uint8)
    return "".join(f"{red:02x}{green:02x}{blue:02x}" for red, green, blue in colours)
