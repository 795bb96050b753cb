"""explain's raw arrays (.npy files next to the JSON) and the pixel-gradient methods' extra numbers."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from vitcli.experiments.explain import Explanation, MethodMap


def _npy(array: np.ndarray) -> bytes:
    stream = io.BytesIO()
    np.save(stream, np.ascontiguousarray(array), allow_pickle=False)
    return stream.getvalue()


def arrays(result: Explanation) -> list[tuple[str, str, np.ndarray]]:
    """(file suffix, what it holds, array) for every raw map: the patch map of each method, and the pixel
    attribution of each pixel method."""
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
    return listed


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


def completeness_text(result: Explanation) -> str:
    checks = [(item.method, item.attribution.completeness) for item in result.maps if item.attribution is not None]
    return "".join(
        f"{method} completeness: sum of attributions {check.attribution_sum:.4g} vs {check.weight_total:.4g} x "
        f"(score {check.score:.4g} - baseline {check.baseline_score:.4g}), relative error {check.relative_error:.2g}\n"
        for method, check in checks
        if check is not None
    )
