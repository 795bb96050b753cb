"""explain's raw arrays (.npy files next to the JSON), the pixel-gradient methods' and dla's extra numbers, and the
audits (localisation, robustness, ROAD, sanity) as tables, JSON, summary columns and a ranking over images."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from rich.table import Table

from vitcli.experiments.attribution import RECONSTRUCTION_TOLERANCE
from vitcli.experiments.explain import Explanation, MethodMap
from vitcli.experiments.localisation import HIT_SHARE, QUADRANTS, Localisation, MethodLocalisation
from vitcli.experiments.road import Road
from vitcli.experiments.robustness import Robustness
from vitcli.grid import PatchGrid
from vitcli.presentation import explain_sanity
from vitcli.presentation.common import method_column


def _npy(array: np.ndarray) -> bytes:
    stream = io.BytesIO()
    np.save(stream, np.ascontiguousarray(array), allow_pickle=False)
    return stream.getvalue()


def arrays(result: Explanation) -> list[tuple[str, str, np.ndarray]]:
    """(file suffix, what it holds, array) for every raw map: the patch map of each method, the pixel
    attribution of each pixel method, and with --sanity each method's maps at every step."""
    listed = []
    for item in result.maps:
        listed.append((f"{item.method}.npy", f"{item.method}: patch map (rows, cols), {item.unit}", item.values))
        if item.attribution is not None:
            listed.append(
                (
                    f"{item.method}.pixels.npy",
                    f"{item.method}: attribution of each normalized input value (channels, height, width)",
                    item.attribution.pixels,
                )
            )
    if result.audits is not None and result.audits.sanity is not None:
        listed += explain_sanity.arrays(result.audits.sanity)
    return listed


def audit_files(result: Explanation) -> dict[str, Any]:
    """Every array, and with --sanity its table of similarities (CSV rows) and its figure."""
    files: dict[str, Any] = array_files(result)
    if result.audits is not None and result.audits.sanity is not None:
        sanity = result.audits.sanity
        files["sanity.csv"] = explain_sanity.rows(sanity)
        files["sanity.png"] = explain_sanity.figure_writer(sanity, result.crop, result.weights_label)
    return files


def array_files(result: Explanation) -> dict[str, bytes]:
    return {suffix: _npy(array) for suffix, _, array in arrays(result)}


def arrays_json(result: Explanation, stem: str) -> list[dict[str, Any]]:
    """Where each array lies (next to the JSON) with its shape and dtype."""
    return [
        {"file": f"{stem}.{suffix}", "what": what, "shape": list(array.shape), "dtype": str(array.dtype)}
        for suffix, what, array in arrays(result)
    ]


def attribution_json(item: MethodMap) -> dict[str, Any]:
    """The signed patch sums and, for Integrated Gradients, its completeness self-check."""
    attribution = item.attribution
    if attribution is None:
        return {}
    body: dict[str, Any] = {"signed_values": attribution.signed.tolist()}
    check = attribution.completeness
    if check is not None:
        body["completeness"] = {
            "what": "sum of the attributions against (sum of the Riemann weights) x (score(x) - score(baseline))",
            "attribution_sum": check.attribution_sum,
            "score": check.score,
            "baseline_score": check.baseline_score,
            "weight_total": check.weight_total,
            "relative_error": check.relative_error,
        }
    return body


def decomposition_json(grid: PatchGrid, item: MethodMap) -> dict[str, Any]:
    """dla's identity: every token's parts per block and the other direct terms, which sum to the model's metric."""
    parts = item.decomposition
    if parts is None:
        return {}
    prefix = parts.token_parts[:, : grid.num_prefix].sum(axis=0)
    return {
        "decomposition": {
            "what": "model_metric = sum of block_token_parts (blocks x tokens, prefix tokens first, then the patches "
            "in order) + embedding + sum of attention_biases + sum of mlps + constant + pool_mlp (attention pooling's "
            "MLP; 0 for CLS or mean pooling)",
            "prefix_token_parts": {name: float(value) for name, value in zip(grid.prefix_names, prefix, strict=True)},
            "patch_parts_sum": float(item.values.sum()),
            "block_token_parts": parts.token_parts.tolist(),
            "embedding": parts.embedding,
            "attention_biases": parts.attention_biases.tolist(),
            "mlps": parts.mlps.tolist(),
            "constant": parts.constant,
            "pool_mlp": parts.pool_mlp,
            "reconstruction": parts.reconstruction,
            "model_metric": parts.model_metric,
            "abs_difference": parts.difference,
            "tolerance": RECONSTRUCTION_TOLERANCE,
        }
    }


def _identity_text(item: MethodMap) -> str:
    parts = item.decomposition
    patches, tokens = float(item.values.sum()), float(parts.token_parts.sum())
    return (
        f"{item.method}: patches {patches:.4g} + prefix tokens {tokens - patches:.4g} + embedding, attention biases, "
        f"MLPs, constant and pool MLP {parts.reconstruction - tokens:.4g} = {parts.reconstruction:.6g} vs the model's "
        f"{parts.model_metric:.6g} (|difference| {parts.difference:.2g})\n"
    )


def completeness_text(result: Explanation) -> str:
    checks = [(item.method, item.attribution.completeness) for item in result.maps if item.attribution is not None]
    lines = [
        f"{method} completeness: sum of attributions {check.attribution_sum:.4g} vs {check.weight_total:.4g} x "
        f"(score {check.score:.4g} - baseline {check.baseline_score:.4g}), relative error {check.relative_error:.2g}\n"
        for method, check in checks
        if check is not None
    ]
    lines += [_identity_text(item) for item in result.maps if item.decomposition is not None]
    return "".join(lines)


# ----- audits: tables, JSON, summary


def audit_tables(result: Explanation) -> list[Table]:
    audits = result.audits
    if audits is None:
        return []
    tables = []
    if audits.localisation is not None:
        tables.append(localisation_table(audits.localisation))
    if audits.robustness is not None:
        tables.append(robustness_table(audits.robustness))
    if audits.road is not None:
        tables.append(road_table(audits.road))
    if audits.sanity is not None:
        tables.append(explain_sanity.table(audits.sanity, result.weights_label))
    return tables


def localisation_table(localisation: Localisation) -> Table:
    resized = ", resized to the image (nearest)" if localisation.resized else ""
    mosaic = localisation.quadrants is not None
    quadrants = f"; a mosaic's target quadrants: {', '.join(_quadrant_names(localisation.quadrants))}" if mosaic else ""
    table = Table(
        title=f"localisation against {localisation.mask.name} ({localisation.kind}{resized}{quadrants})",
        caption=f"pointing game: the largest patch has at least {HIT_SHARE:g} of its pixels on the object; "
        "mass accuracy: share of the positive map mass on the object; signed: sum of the values on the object / "
        "sum of all values (Quantus's)"
        + ("; Focus: share of the positive mass in the target quadrants" if mosaic else "")
        + " (higher is better)",
    )
    columns = ["method", "top patch", "pointing game", "mass accuracy", "mass accuracy signed"]
    for column in columns + (["Focus"] if mosaic else []):
        table.add_column(column, justify="left" if column == "method" else "right")
    for item in localisation.methods:
        mass = "no positive mass" if item.mass_accuracy is None else f"{item.mass_accuracy:.4g}"
        signed = "sum 0" if item.mass_accuracy_signed is None else f"{item.mass_accuracy_signed:.4g}"
        cells = [item.method, f"P{item.top_patch}", "hit" if item.hit else "miss", mass, signed]
        if mosaic:
            cells.append("no positive mass" if item.focus is None else f"{item.focus:.4g}")
        table.add_row(*cells)
    return table


def _quadrant_names(quadrants: tuple[int, ...]) -> list[str]:
    return [name for name, flag in zip(QUADRANTS, quadrants, strict=True) if flag]


LOCALISATION_DEFINITION = (
    "pointing_game: the largest patch (ties by patch number) has at least hit_share of its pixels on the object; "
    "mass_accuracy: sum of max(v, 0) x object share / sum of max(v, 0), the positive mass only; "
    "mass_accuracy_signed: sum of v x object share / sum of v (Quantus's RelevanceMassAccuracy)"
)
FOCUS_DEFINITION = (
    "; focus: sum of max(v, 0) in the target quadrants / sum of max(v, 0) (Arias-Duart et al. 2022), the mask being "
    "whole quadrants of a 2x2 mosaic"
)


def _localisation_json(item: MethodLocalisation, mosaic: bool) -> dict[str, Any]:
    body = {
        "method": item.method,
        "top_patch": f"P{item.top_patch}",
        "pointing_game": item.hit,
        "mass_accuracy": item.mass_accuracy,
        "mass_accuracy_signed": item.mass_accuracy_signed,
    }
    return body | ({"focus": item.focus} if mosaic else {})


def robustness_table(robustness: Robustness) -> Table:
    table = Table(
        title=f"robustness: {robustness.samples} perturbations uniform in +-{robustness.radius:g} of the pixel range "
        f"(+-{_per_channel(robustness.normalized_radius)} after normalization), seed {robustness.seed}",
        caption="sensitivity = ||map(x + delta) - map(x)|| / ||map(x)|| (Frobenius); lower is more robust",
    )
    for column in ("method", "max-sensitivity", "average sensitivity"):
        table.add_column(column, justify="left" if column == "method" else "right")
    for item in robustness.methods:
        table.add_row(item.method, f"{item.max:.4g}", f"{item.mean:.4g}")
    return table


def _per_channel(values: list[float]) -> str:
    """One number when the channels share it (a model normalizing with one std), else one per channel."""
    shown = [f"{value:.3g}" for value in values]
    if len(set(shown)) == 1:
        return shown[0]
    return ", ".join(f"{value} {channel}" for value, channel in zip(shown, "RGB", strict=False))


def road_table(road: Road) -> Table:
    table = Table(
        title=f"ROAD: patches imputed (noisy linear, noise {road.noise:g}, seed {road.seed}) at "
        f"{road.percents[0]}..{road.percents[-1]}%; clean probability {road.clean_probability:.4g}",
        caption="MoRF: most relevant removed first (lower mean is better); LeRF: least relevant first (higher is "
        "better); tied patches go together; combined = (mean LeRF - mean MoRF) / 2 (higher is better)",
    )
    for column in ("method", "MoRF mean", "LeRF mean", "combined"):
        table.add_column(column, justify="left" if column == "method" else "right")
    for item in road.methods:
        table.add_row(item.method, f"{item.morf.mean():.4g}", f"{item.lerf.mean():.4g}", f"{item.combined:.4g}")
    return table


def audits_json(result: Explanation) -> dict[str, Any]:
    audits = result.audits
    body: dict[str, Any] = {}
    if audits is None:
        return body
    if audits.localisation is not None:
        localisation = audits.localisation
        body["localisation"] = {
            "mask": str(localisation.mask),
            "kind": localisation.kind,
            "object": "value 1" if localisation.kind == "trimap" else "non-zero values",
            "resized": localisation.resized,
            "hit_share": HIT_SHARE,
            "definition": LOCALISATION_DEFINITION + (FOCUS_DEFINITION if localisation.quadrants is not None else ""),
            "quadrants": None if localisation.quadrants is None else _quadrant_names(localisation.quadrants),
            "object_share": localisation.object_share.tolist(),
            "methods": [_localisation_json(item, localisation.quadrants is not None) for item in localisation.methods],
        }
    if audits.robustness is not None:
        robustness = audits.robustness
        body["robustness"] = {
            "definition": "sensitivity = ||map(x + delta) - map(x)||_F / ||map(x)||_F, delta uniform in +-radius/std "
            "per normalized value; max and mean over the samples (Yeh et al. 2019)",
            "radius": robustness.radius,
            "normalized_radius": robustness.normalized_radius,
            "samples": robustness.samples,
            "seed": robustness.seed,
            "methods": [
                {
                    "method": item.method,
                    "max_sensitivity": item.max,
                    "avg_sensitivity": item.mean,
                    "sensitivities": item.sensitivities.tolist(),
                }
                for item in robustness.methods
            ],
        }
    if audits.road is not None:
        road = audits.road
        body["road"] = {
            "definition": "target probability after noisy linear imputation of the most (MoRF) or least (LeRF) "
            "relevant patches; combined = (mean LeRF - mean MoRF) / 2 (Rong et al. 2022)",
            "percents": road.percents,
            "tie_policy": road.tie_policy,
            "noise": road.noise,
            "seed": road.seed,
            "clean_probability": road.clean_probability,
            "methods": [
                {
                    "method": item.method,
                    "morf": item.morf.tolist(),
                    "lerf": item.lerf.tolist(),
                    "morf_patches": item.morf_patches,
                    "lerf_patches": item.lerf_patches,
                    "morf_mean": float(item.morf.mean()),
                    "lerf_mean": float(item.lerf.mean()),
                    "combined": item.combined,
                }
                for item in road.methods
            ],
        }
    if audits.sanity is not None:
        body["sanity"] = explain_sanity.document(audits.sanity, result.weights_label)
    return body


# ----- scores over images: from the per-image JSON bodies alone, so stored results give the same numbers

# score -> (where in the JSON body's "audits", the per-method key, True when higher is better)
SCORES = {
    "pointing_game": ("localisation", "pointing_game", True),
    "mass_accuracy": ("localisation", "mass_accuracy", True),
    "mass_accuracy_signed": ("localisation", "mass_accuracy_signed", True),
    "focus": ("localisation", "focus", True),
    "max_sensitivity": ("robustness", "max_sensitivity", False),
    "avg_sensitivity": ("robustness", "avg_sensitivity", False),
    "road_morf": ("road", "morf_mean", False),
    "road_lerf": ("road", "lerf_mean", True),
    "road_combined": ("road", "combined", True),
    "sanity_all_blocks_spearman_abs": ("sanity", "all_blocks_spearman_abs", False),
    "sanity_random_logit_spearman_abs": ("sanity", "random_logit_spearman_abs", False),
}


def audit_scores(document: dict[str, Any]) -> dict[str, dict[str, float]]:
    """score -> method -> value of one image's result body (booleans as 0/1); scores without a value left out."""
    audits = document.get("audits") or {}
    scores: dict[str, dict[str, float]] = {}
    for score, (section, key, _) in SCORES.items():
        for entry in (audits.get(section) or {}).get("methods", []):
            value = entry.get(key)
            if value is not None:
                scores.setdefault(score, {})[entry["method"]] = float(value)
    return scores


def audit_summary(result: Explanation) -> dict[str, Any]:
    return {
        f"explain_{method_column(method)}_{score}": value
        for score, values in audit_scores({"audits": audits_json(result)}).items()
        for method, value in values.items()
    }


def score_ranking(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per score and method over the images: images, mean, sample sd (ddof 1; 0 for one image) and the rank of the
    mean (1 = best; equal means share the best rank)."""
    values: dict[str, dict[str, list[float]]] = {}
    for document in documents:
        for score, methods in audit_scores(document).items():
            for method, value in methods.items():
                values.setdefault(score, {}).setdefault(method, []).append(value)
    rows = []
    for score, methods in values.items():
        higher_better = SCORES[score][2]
        means = {method: float(np.mean(listed)) for method, listed in methods.items()}
        for method, listed in methods.items():
            better = sum(
                1 for other in means.values() if (other > means[method]) == higher_better and other != means[method]
            )
            rows.append(
                {
                    "score": score,
                    "method": method,
                    "images": len(listed),
                    "mean": means[method],
                    "sd": float(np.std(listed, ddof=1)) if len(listed) > 1 else 0.0,
                    "rank": better + 1,
                    "better": "higher" if higher_better else "lower",
                }
            )
    return sorted(rows, key=lambda row: (list(SCORES).index(row["score"]), row["rank"], row["method"]))


def ranking_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="audit scores over images: mean (sd), methods ranked per score (1 = best)")
    for column in ("score", "method", "images", "mean (sd)", "rank"):
        table.add_column(column, justify="left" if column in ("score", "method") else "right")
    for row in rows:
        table.add_row(
            f"{row['score']} ({row['better']} is better)",
            row["method"],
            str(row["images"]),
            f"{row['mean']:.4g} ({row['sd']:.2g})",
            str(row["rank"]),
        )
    return table
