"""Explanation maps and their faithfulness curves as tables, CSV rows, JSON, figures and a summary.

Every number shown is a raw value of its method (each in its own unit); figures give each map its own colour scale
and say so in the panel's caption, because one shared or min-max normalized scale hides how the methods differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from vitcli.experiments.explain import Explanation, MethodMap
from vitcli.experiments.explain_gradients import OUTPUT_TOLERANCE
from vitcli.experiments.faithfulness import RANDOM, Curve, Faithfulness, MethodSpread
from vitcli.experiments.results import ClassProbability, EmbeddingScore
from vitcli.grid import PatchGrid
from vitcli.presentation.common import method_column
from vitcli.presentation.explain_audit import (
    attribution_json,
    audit_summary,
    audit_tables,
    audits_json,
    completeness_text,
    decomposition_json,
)
from vitcli.render import weights_caption

TOP_PATCHES = 5


def top_patches(grid: PatchGrid, values: np.ndarray, count: int) -> list[tuple[int, float]]:
    """(patch number, value) of the `count` largest values, largest first; ties by patch number, NaN never."""
    flat = values.reshape(-1)
    ranked = sorted((index for index in range(flat.size) if not np.isnan(flat[index])), key=lambda i: (-flat[i], i))
    return [(index + 1, float(flat[index])) for index in ranked[:count]]


def _target_text(result: Explanation) -> str:
    target, contrast = result.target, result.contrast
    if isinstance(target, EmbeddingScore):
        return f"{target.label} (clean {target.target.unit} {target.score:.4g})"
    text = f"{target.index} {target.label.split(',')[0]} (clean p {target.probability:.4g})"
    if contrast is not None:
        text += f" rather than {contrast.index} {contrast.label.split(',')[0]} (clean p {contrast.probability:.4g})"
    return text


def _check_text(result: Explanation) -> str:
    if result.output_difference is None:
        return completeness_text(result)
    return completeness_text(result) + (
        f"self-check: logits under the hooks vs eval forward, max |difference| {result.output_difference:.2g} "
        f"(tolerance {OUTPUT_TOLERANCE:g})\n"
    )


# ----- tables


def table(result: Explanation, top: int = TOP_PATCHES) -> Group:
    maps = Table(
        title=f"{result.source.display_path}\ntop patches per method for {_target_text(result)}",
        caption=Text.assemble(
            "raw values, each method in its own unit: "
            + "; ".join(f"{item.method}: {item.unit}" for item in result.maps)
            + f"\n{_check_text(result)}",
            weights_caption(result.weights_label),
        ),
        min_width=90,
    )
    maps.add_column("rank", justify="right")
    ranked = [top_patches(result.grid, item.values, top) for item in result.maps]
    for item in result.maps:
        maps.add_column(item.method, justify="left", no_wrap=True)
    for rank in range(top):
        cells = [f"P{entries[rank][0]} {entries[rank][1]:.4g}" if rank < len(entries) else "" for entries in ranked]
        maps.add_row(str(rank + 1), *cells)
    parts: list[Any] = [maps]
    if result.faithfulness is not None:
        parts.append(faithfulness_table(result))
    parts += audit_tables(result)
    return Group(*parts)


def faithfulness_table(result: Explanation) -> Table:
    curves = result.faithfulness
    assert curves is not None
    table = Table(
        title=f"faithfulness on this image: {curves.steps} steps of {curves.patches} patches, {result.fill} fill",
        caption=Text.assemble(f"{curves.definition}\n{_random_text(curves)}", weights_caption(result.weights_label)),
        min_width=100,
    )
    for column in ("method", "deletion AUC", "rank (deletion)", "insertion AUC", "rank (insertion)"):
        table.add_column(column, justify="left" if column == "method" else "right")
    aucs = {item.method: (item.deletion.auc, item.insertion.auc) for item in curves.methods}
    if curves.random is not None:
        aucs[RANDOM] = (curves.random.deletion.auc, curves.random.insertion.auc)
    for method, deletion_rank, insertion_rank in sorted(curves.ranking(), key=lambda entry: entry[1]):
        deletion, insertion = aucs[method]
        table.add_row(method, f"{deletion:.4g}", str(deletion_rank), f"{insertion:.4g}", str(insertion_rank))
    return table


def _random_text(curves: Faithfulness) -> str:
    random = curves.random
    if random is None:
        return ""
    return (
        f"random: mean of {random.orders} orders (seed {random.seed}); AUC spread (sd) deletion "
        f"{random.deletion_aucs.std():.2g}, insertion {random.insertion_aucs.std():.2g}\n"
    )


def spread_table(spreads: Sequence[MethodSpread]) -> Table:
    """Mean and spread of each method's AUCs over many images (from faithfulness_spread)."""
    table = Table(title="faithfulness over images: mean (sd) of the AUCs; lower deletion, higher insertion is better")
    for column in ("method", "images", "deletion AUC", "insertion AUC"):
        table.add_column(column, justify="left" if column == "method" else "right")
    for spread in sorted(spreads, key=lambda spread: spread.deletion_mean):
        table.add_row(
            spread.method,
            str(spread.images),
            f"{spread.deletion_mean:.4g} ({spread.deletion_std:.2g})",
            f"{spread.insertion_mean:.4g} ({spread.insertion_std:.2g})",
        )
    return table


# ----- CSV rows


def rows(result: Explanation) -> list[dict[str, Any]]:
    """One row per method and patch, in patch order, with the raw value and its rank within the method."""
    table_rows = []
    for item in result.maps:
        ranked = top_patches(result.grid, item.values, item.values.size)
        ranks = {patch: rank for rank, (patch, _) in enumerate(ranked, start=1)}
        for index, value in enumerate(item.values.reshape(-1).tolist()):
            patch = index + 1
            row, col = result.grid.position(patch)
            table_rows.append(
                {
                    "target_class": _target_column(result.target),
                    "method": item.method,
                    "patch": f"P{patch}",
                    "token": result.grid.token_of_patch(patch),
                    "row": row,
                    "col": col,
                    "value": value,
                    "rank": ranks.get(patch),
                    "unit": item.unit,
                }
            )
    return table_rows


def curve_rows(result: Explanation) -> list[dict[str, Any]]:
    """One row per method, curve and step; the random baseline's rows carry its spread over the orders."""
    curves = result.faithfulness
    if curves is None:
        return []
    listed: list[tuple[str, str, Curve, np.ndarray | None]] = []
    for item in curves.methods:
        listed += [(item.method, "deletion", item.deletion, None), (item.method, "insertion", item.insertion, None)]
    if curves.random is not None:
        listed += [
            (RANDOM, "deletion", curves.random.deletion, curves.random.deletion_spread),
            (RANDOM, "insertion", curves.random.insertion, curves.random.insertion_spread),
        ]
    return [
        {
            "target_class": curves.target,
            "measure": curves.measure,
            "method": method,
            "curve": kind,
            "step": step,
            "fraction": float(curve.fractions[step]),
            "patches": round(float(curve.fractions[step]) * curves.patches),
            "probability": float(curve.probabilities[step]),
            "probability_sd": float(spread[step]) if spread is not None else None,
            "auc": curve.auc,
        }
        for method, kind, curve, spread in listed
        for step in range(len(curve.fractions))
    ]


def spread_rows(spreads: Sequence[MethodSpread]) -> list[dict[str, Any]]:
    return [
        {
            "method": spread.method,
            "images": spread.images,
            "deletion_auc_mean": spread.deletion_mean,
            "deletion_auc_sd": spread.deletion_std,
            "insertion_auc_mean": spread.insertion_mean,
            "insertion_auc_sd": spread.insertion_std,
        }
        for spread in spreads
    ]


# ----- JSON


def document(result: Explanation, top: int = TOP_PATCHES) -> dict[str, Any]:
    grid = result.grid
    body: dict[str, Any] = {
        "weights": result.weights_label,
        "target": _class_json(result.target),
        "clean_top1": None if result.top1 is None else _class_json(result.top1),
        "contrast": None if result.contrast is None else _class_json(result.contrast),
        "block": result.block,
        "fill": result.fill,
        "grid": {
            "rows": grid.rows,
            "cols": grid.cols,
            "patch_size": grid.patch_size,
            "prefix_tokens": list(grid.prefix_names),
        },
        "self_check": {
            "what": "largest |logits of the hooked forward - the model's eval forward|",
            "max_abs_difference": result.output_difference,
            "tolerance": OUTPUT_TOLERANCE,
        },
        "maps": [_map_json(grid, item, top) for item in result.maps],
    }
    if result.faithfulness is not None:
        body["faithfulness"] = _faithfulness_json(result.faithfulness)
    if result.audits is not None:
        body["audits"] = audits_json(result)
    return body


def _class_json(score: ClassProbability | EmbeddingScore) -> dict[str, Any]:
    if isinstance(score, EmbeddingScore):
        return score.to_json()
    return {"kind": "class", "class_index": score.index, "label": score.label, "probability": score.probability}


def _target_column(score: ClassProbability | EmbeddingScore) -> int | str:
    """A CSV cell naming the target: the class index, or the embedding target in a few words."""
    return score.label if isinstance(score, EmbeddingScore) else score.index


def _map_json(grid: PatchGrid, item: MethodMap, top: int) -> dict[str, Any]:
    return {
        "method": item.method,
        "unit": item.unit,
        "definition": item.definition,
        "top": [{"patch": f"P{patch}", "value": value} for patch, value in top_patches(grid, item.values, top)],
        "values": [[None if np.isnan(value) else float(value) for value in line] for line in item.values],
        **attribution_json(item),
        **decomposition_json(grid, item),
    }


def _faithfulness_json(curves: Faithfulness) -> dict[str, Any]:
    def curve_json(curve: Curve) -> dict[str, Any]:
        return {"fractions": curve.fractions.tolist(), "probabilities": curve.probabilities.tolist(), "auc": curve.auc}

    body: dict[str, Any] = {
        "definition": curves.definition,
        "measure": curves.measure,
        "steps": curves.steps,
        "patches": curves.patches,
        "clean_probability": curves.clean_probability,
        "covered_probability": curves.covered_probability,
        "methods": [
            {
                "method": item.method,
                "order": [f"P{patch}" for patch in item.order],
                "deletion": curve_json(item.deletion),
                "insertion": curve_json(item.insertion),
            }
            for item in curves.methods
        ],
        "ranking": [
            {"method": method, "deletion_rank": deletion, "insertion_rank": insertion}
            for method, deletion, insertion in curves.ranking()
        ],
    }
    if curves.random is not None:
        random = curves.random
        body["random"] = {
            "orders": random.orders,
            "seed": random.seed,
            "deletion": {**curve_json(random.deletion), "sd": random.deletion_spread.tolist()},
            "insertion": {**curve_json(random.insertion), "sd": random.insertion_spread.tolist()},
            "deletion_aucs": random.deletion_aucs.tolist(),
            "insertion_aucs": random.insertion_aucs.tolist(),
        }
    return body


# ----- figures


def figure(result: Explanation) -> Any:
    """The maps side by side over the crop, each on its own colour scale (stated under the panel); below them,
    with faithfulness, the deletion and insertion curves."""
    from vitcli import figures

    columns = len(result.maps)
    width = max(3.4 * columns + 1.2, 11.0)
    if result.faithfulness is None:
        fig = figures.plt.figure(figsize=(width, 4.4), layout="constrained")
        _draw_maps(figures, fig, result)
    else:
        fig = figures.plt.figure(figsize=(width, 9.4), layout="constrained")
        maps_part, curves_part = fig.subfigures(2, 1, height_ratios=[4.4, 5.0])
        _draw_maps(figures, maps_part, result)
        _draw_curves(curves_part, result)
    figures.title(fig, f"{result.source.display_name}: maps for {_target_text(result)}", result.weights_label)
    return fig


def _draw_maps(figures: Any, part: Any, result: Explanation) -> None:
    panels = part.subplots(1, len(result.maps), squeeze=False)[0]
    for panel, item in zip(panels, result.maps, strict=True):
        panel.set_xticks([])
        panel.set_yticks([])
        values = item.values
        low, high = float(np.nanmin(values)), float(np.nanmax(values))
        if low < 0:
            # Signed maps (occlusion can raise the probability): a scale centred on 0 keeps the sign readable.
            reach = max(-low, high) or 1e-12
            mappable = figures.overlay(panel, result.crop, values, "RdBu_r", -reach, reach, alpha=0.7)
            scale = f"-{reach:.3g} (blue) .. +{reach:.3g} (red), centred on 0"
        else:
            # The map's own range: attention-like maps vary little around a large mean, and 0..max would hide it.
            top = high if high > low else low + 1e-12
            mappable = figures.overlay(panel, result.crop, values, "inferno", low, top)
            scale = f"min {low:.3g} .. max {top:.3g}"
        part.colorbar(mappable, ax=panel, shrink=0.75, pad=0.02)
        panel.set_title(item.method, fontsize=10)
        panel.set_xlabel(f"this map's own colour scale:\n{scale}\n{item.unit}", fontsize=8)


def _draw_curves(part: Any, result: Explanation) -> None:
    """Deletion and insertion curves of every method, with the random baseline's mean and spread (sd band)."""
    curves = result.faithfulness
    assert curves is not None
    for panel, kind in zip(part.subplots(1, 2), ("deletion", "insertion"), strict=True):
        for item in curves.methods:
            curve = getattr(item, kind)
            panel.plot(curve.fractions, curve.probabilities, marker=".", label=f"{item.method} (AUC {curve.auc:.4g})")
        if curves.random is not None:
            curve, spread = getattr(curves.random, kind), getattr(curves.random, f"{kind}_spread")
            panel.plot(
                curve.fractions,
                curve.probabilities,
                color="gray",
                linestyle="--",
                label=f"random, {curves.random.orders} orders (AUC {curve.auc:.4g})",
            )
            panel.fill_between(
                curve.fractions, curve.probabilities - spread, curve.probabilities + spread, color="gray", alpha=0.2
            )
        moved = "covered" if kind == "deletion" else "revealed"
        better = "lower" if kind == "deletion" else "higher"
        panel.set_xlabel(f"fraction of patches {moved} ({result.fill} fill), most relevant first")
        followed = f"class {curves.target}" if curves.measure == "probability" else str(curves.target)
        panel.set_ylabel(f"{curves.measure} of {followed}", parse_math=False)  # a text target, as written
        panel.set_title(f"{kind}: {better} AUC is better", fontsize=10)
        panel.set_xlim(0, 1)
        panel.legend(fontsize=7)
    part.suptitle(
        f"faithfulness, {curves.steps} steps: AUC = trapezoidal area over the fraction of patches 0..1, "
        "unperturbed point included",
        fontsize=9,
    )


# ----- one row per image


def summary(result: Explanation) -> dict[str, Any]:
    values: dict[str, Any] = {
        "explain_target_class": _target_column(result.target),
        "explain_target_probability": getattr(result.target, "probability", None),
    }
    for item in result.maps:
        best = top_patches(result.grid, item.values, 1)
        values[f"explain_{method_column(item.method)}_top_patch"] = f"P{best[0][0]}" if best else None
    if result.faithfulness is not None:
        curves = result.faithfulness
        aucs = [(item.method, item.deletion.auc, item.insertion.auc) for item in curves.methods]
        if curves.random is not None:
            aucs.append((RANDOM, curves.random.deletion.auc, curves.random.insertion.auc))
        for method, deletion, insertion in aucs:
            values[f"explain_{method_column(method)}_deletion_auc"] = deletion
            values[f"explain_{method_column(method)}_insertion_auc"] = insertion
    return values | audit_summary(result)
