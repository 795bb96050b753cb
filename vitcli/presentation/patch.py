"""Patching results as tables, long-form rows, JSON and summary numbers (the figure: presentation/patch_figure.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.console import Group
from rich.table import Table

from vitcli.experiments.patch_result import DENOMINATOR_TOLERANCE, ImageSide, KindScores, PatchResult
from vitcli.render import weights_caption

SCORE = "score = (M_patched - M_corrupt) / (M_clean - M_corrupt): 1 restores CLEAN's M, 0 changes nothing"
SHOWN = 10  # strongest residual sites listed in the table


def _short(label: str) -> str:
    return label.split(",")[0]


def metric_text(result: PatchResult) -> str:
    if result.embedding is not None:
        return f"M = {result.embedding.unit} ({result.embedding.short}): {result.embedding.definition}"
    return (
        f"M = logit({result.target} {_short(result.target_label)}) - logit({result.contrast} "
        f"{_short(result.contrast_label)}); target: {result.target_rule}; contrast: {result.contrast_rule}"
    )


def scores_of(result: PatchResult, kind: str) -> KindScores | None:
    return next((scores for scores in result.kinds if scores.kind == kind), None)


def _cell(scores: KindScores, where: Any) -> str:
    """One site's score by each method asked: `activation` or `attribution`, or `activation / attribution`."""
    values = [array[where] for array in (scores.activation, scores.attribution) if array is not None]
    return " / ".join(f"{float(value):+.3f}" for value in values)


def _methods_note(result: PatchResult) -> str:
    return " / ".join(result.methods)


def table(result: PatchResult) -> Group:
    parts: list[Any] = [_images_table(result), metric_text(result), SCORE]
    sublayers = [scores for scores in result.kinds if scores.kind in ("attention", "mlp")]
    if sublayers:
        parts.append(_sublayer_table(result, sublayers))
    heads = scores_of(result, "heads")
    if heads is not None:
        parts.append(_heads_table(result, heads))
    residual = scores_of(result, "residual")
    if residual is not None:
        parts.append(_residual_table(result, residual))
    parts.extend(_correlation_lines(result))
    forwards = f"{result.patched_forwards:,} patched forwards" if "activation" in result.methods else ""
    gradient = "attribution: one forward of each image and one backward" if "attribution" in result.methods else ""
    parts.append("cost: " + "; ".join(part for part in (forwards, gradient) if part))
    return Group(*parts)


def _images_table(result: PatchResult) -> Table:
    images = Table(title=f"{result.model_name}: patching CLEAN into CORRUPT", caption=weights_caption(result.weights))
    for column in ("image", "file", "top-1", "probability", "M"):
        images.add_column(column, justify="right" if column in ("probability", "M") else "left")
    for role, side in (("CLEAN", result.clean), ("CORRUPT", result.corrupt)):
        best = side.top[0] if side.top else None  # no classes when the forward ends at the embedding
        images.add_row(
            role,
            side.source.display_path,
            "" if best is None else f"{best.index} {_short(best.label)}",
            "" if best is None else f"{best.probability:.6f}",
            f"{side.m:+.4f}",
        )
    return images


def _sublayer_table(result: PatchResult, sublayers: list[KindScores]) -> Table:
    sublayer = Table(title=f"whole sublayer outputs, every token ({_methods_note(result)})")
    sublayer.add_column("block", justify="right")
    for scores in sublayers:
        sublayer.add_column(scores.kind, justify="right")
    for block in range(len(_any_array(sublayers[0]))):
        sublayer.add_row(str(block + 1), *(_cell(scores, block) for scores in sublayers))
    return sublayer


def _heads_table(result: PatchResult, heads: KindScores) -> Table:
    grid = _any_array(heads)
    table_ = Table(title=f"heads: each head's slice of the input to attn.proj, every token ({_methods_note(result)})")
    table_.add_column("block", justify="right")
    for head in range(grid.shape[1]):
        table_.add_column(f"head {head + 1}", justify="right")
    for block in range(grid.shape[0]):
        table_.add_row(str(block + 1), *(_cell(heads, (block, head)) for head in range(grid.shape[1])))
    return table_


def _residual_table(result: PatchResult, residual: KindScores) -> Table:
    grid = _any_array(residual)
    strongest = np.argsort(np.abs(grid), axis=None)[::-1][:SHOWN]
    table_ = Table(
        title=f"residual rows entering a block: the {SHOWN} largest |scores|",
        caption=f"({_methods_note(result)}) every block and token is in the CSV, the JSON and the figure",
    )
    for column in ("block", "token", "score"):
        table_.add_column(column, justify="right")
    for flat in strongest:
        block, token = np.unravel_index(flat, grid.shape)
        table_.add_row(str(block + 1), result.grid.token_name(int(token)), _cell(residual, (block, token)))
    return table_


def _correlation_lines(result: PatchResult) -> list[str]:
    if result.pearson is None and not any(scores.pearson is not None for scores in result.kinds):
        return []
    lines = [
        f"activation vs attribution over {scores.kind} sites: Pearson {_number(scores.pearson)}, Spearman "
        f"{_number(scores.spearman)}"
        for scores in result.kinds
    ]
    lines.append(f"over every site: Pearson {_number(result.pearson)}, Spearman {_number(result.spearman)}")
    return lines


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _any_array(scores: KindScores) -> np.ndarray:
    return scores.activation if scores.activation is not None else scores.attribution


def rows(result: PatchResult) -> list[dict[str, Any]]:
    """One row per site: kind, block, head (heads), token and its name (residual), and each method's score."""
    table_rows = []
    for scores in result.kinds:
        grid = _any_array(scores)
        for where in np.ndindex(grid.shape):
            block = where[0] + 1
            head = where[1] + 1 if scores.kind == "heads" else None
            token = where[1] if scores.kind == "residual" else None
            table_rows.append(
                {
                    "kind": scores.kind,
                    "block": block,
                    "head": head,
                    "token": token,
                    "token_name": None if token is None else result.grid.token_name(token),
                    "activation": None if scores.activation is None else float(scores.activation[where]),
                    "attribution": None if scores.attribution is None else float(scores.attribution[where]),
                }
            )
    return table_rows


def _side(side: ImageSide) -> dict[str, Any]:
    return {"image": side.source.to_json(), "top": [vars(entry) for entry in side.top], "m": side.m}


def document(result: PatchResult) -> dict[str, Any]:
    return {
        "weights": result.weights,
        "clean": _side(result.clean),
        "corrupt": _side(result.corrupt),
        "metric": {
            "definition": "M = logit(target) - logit(contrast)"
            if result.embedding is None
            else f"M = {result.embedding.definition}",
            "target": {
                "kind": "class",
                "index": result.target,
                "label": result.target_label,
                "rule": result.target_rule,
            }
            if result.embedding is None
            else result.embedding.describe(),
            "contrast": None
            if result.embedding is not None
            else {"index": result.contrast, "label": result.contrast_label, "rule": result.contrast_rule},
            "m_clean": result.m_clean,
            "m_corrupt": result.m_corrupt,
            "denominator_tolerance": DENOMINATOR_TOLERANCE,
        },
        "score": SCORE,
        "methods": result.methods,
        "token_names": [result.grid.token_name(token) for token in range(result.grid.num_tokens)],
        "sites": {
            scores.kind: {
                "activation": None if scores.activation is None else scores.activation.tolist(),
                "attribution": None if scores.attribution is None else scores.attribution.tolist(),
                "pearson": scores.pearson,
                "spearman": scores.spearman,
            }
            for scores in result.kinds
        },
        "correlation": {"pearson": result.pearson, "spearman": result.spearman},
        "patched_forwards": result.patched_forwards,
    }


def figure(result: PatchResult) -> Any:
    from vitcli.presentation.patch_figure import patch_figure

    return patch_figure(result)


def summary(result: PatchResult) -> dict[str, Any]:
    numbers: dict[str, Any] = {"patch_m_clean": result.m_clean, "patch_m_corrupt": result.m_corrupt}
    for scores in result.kinds:
        grid = _any_array(scores)
        flat = int(np.argmax(np.abs(grid)))
        numbers[f"patch_{scores.kind}_largest_site"] = _site_name(
            result, scores.kind, np.unravel_index(flat, grid.shape)
        )
        numbers[f"patch_{scores.kind}_largest_score"] = float(grid.ravel()[flat])
    if result.pearson is not None:
        numbers["patch_pearson"], numbers["patch_spearman"] = result.pearson, result.spearman
    return numbers


def _site_name(result: PatchResult, kind: str, where: tuple[Any, ...]) -> str:
    """A site as summary.csv names it: `B4` (attention, mlp), `B4.H2` (heads), `B4 P63` or `B4 CLS` (residual)."""
    block = f"B{int(where[0]) + 1}"
    if kind == "heads":
        return f"{block}.H{int(where[1]) + 1}"
    return f"{block} {result.grid.token_name(int(where[1]))}" if kind == "residual" else block
