"""explain --sanity as a table, JSON, CSV rows, arrays and a figure (maps strip per method, similarity curves)."""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.table import Table

from vitcli.experiments.sanity import Sanity

RANDOM_WEIGHTS_NOTE = (
    "the weights are RANDOM: the randomisation test compares one untrained model with another and needs a trained "
    "model to mean anything"
)


def _note(weights_label: str) -> str:
    return RANDOM_WEIGHTS_NOTE if weights_label.upper().startswith("RANDOM") else ""


def _all_blocks(result: Sanity):
    return [step for step in result.steps if step.kind == "cascading"][-2]


def table(result: Sanity, weights_label: str) -> Table:
    all_blocks = _all_blocks(result)
    note = _note(weights_label)
    table = Table(
        title=f"sanity checks (seed {result.seed}): similarity with the original map" + (f"\n{note}" if note else ""),
        caption=f"pass: absolute Spearman correlation below {result.threshold:g} once every block is randomised "
        f"(cascading step '{all_blocks.name}'); random logit: the map for class {result.random_class} instead",
    )
    for column in ("method", "Spearman |map|", "Spearman map", "SSIM", "random logit Spearman |map|", "check"):
        table.add_column(column, justify="left" if column == "method" else "right")
    for method, score in all_blocks.similarity.items():
        table.add_row(
            method,
            f"{score.spearman_abs:.3g}",
            f"{score.spearman_signed:.3g}",
            f"{score.ssim:.3g}",
            f"{result.random_logit[method].spearman_abs:.3g}",
            "pass" if result.passed(method) else "FAIL",
        )
    return table


def _similarity_json(score) -> dict[str, float]:
    return {"spearman_abs": score.spearman_abs, "spearman_signed": score.spearman_signed, "ssim": score.ssim}


def document(result: Sanity, weights_label: str) -> dict[str, Any]:
    methods = list(result.steps[0].maps)
    return {
        "definition": "model-parameter randomisation (Adebayo et al. 2018) with timm's fresh-model initialisers: "
        "cascading from the last block, then the embeddings; independent, one block at a time; similarity with "
        "the original map: Spearman of |map| and of map, SSIM of min-max scaled |map|",
        "note": _note(weights_label) or None,
        "seed": result.seed,
        "threshold": result.threshold,
        "steps": [
            {
                "kind": step.kind,
                "name": step.name,
                "modules": step.modules,
                "similarity": {method: _similarity_json(score) for method, score in step.similarity.items()},
            }
            for step in result.steps
        ],
        "random_logit": {
            "class_index": result.random_class,
            "similarity": {method: _similarity_json(score) for method, score in result.random_logit.items()},
        },
        "methods": [
            {
                "method": method,
                "passed": result.passed(method),
                "all_blocks_spearman_abs": _all_blocks(result).similarity[method].spearman_abs,
                "random_logit_spearman_abs": result.random_logit[method].spearman_abs,
            }
            for method in methods
        ],
    }


def rows(result: Sanity) -> list[dict[str, Any]]:
    listed = [(step.kind, step.name, step.similarity) for step in result.steps]
    listed.append(("random logit", f"class {result.random_class}", result.random_logit))
    return [
        {"kind": kind, "step": name, "method": method, **_similarity_json(score)}
        for kind, name, scores in listed
        for method, score in scores.items()
    ]


def arrays(result: Sanity) -> list[tuple[str, str, np.ndarray]]:
    """Per method, every step's map stacked (the original first), the random-logit map last."""
    names = [step.name for step in result.steps] + [f"random logit (class {result.random_class})"]
    return [
        (
            f"sanity.{method}.npy",
            f"{method}: maps at each sanity step (step, rows, cols): " + "; ".join(names),
            np.stack([step.maps[method] for step in result.steps] + [result.random_logit_maps[method]]),
        )
        for method in result.steps[0].maps
    ]


def figure_writer(result: Sanity, crop: np.ndarray, weights_label: str) -> Any:
    """Writes the figure as PNG when the store asks (an extra file, built only then)."""

    def write(stream: Any) -> None:
        from vitcli import figures

        built = figure(result, crop, weights_label)
        try:
            built.savefig(stream, format="png", dpi=150, bbox_inches="tight")
        finally:
            figures.plt.close(built)

    return write


def figure(result: Sanity, crop: np.ndarray, weights_label: str) -> Any:
    """One row per method: the map after each cascading step (each on its own scale) and the similarity curves."""
    from vitcli import figures

    methods = list(result.steps[0].maps)
    cascade = [step for step in result.steps if step.kind in ("original", "cascading")]
    columns = len(cascade) + 2
    fig = figures.plt.figure(figsize=(1.6 * columns, 1.9 * len(methods) + 0.8), layout="constrained")
    panels = fig.subplots(len(methods), columns, squeeze=False)
    for row, method in enumerate(methods):
        for column, step in enumerate(cascade):
            panel = panels[row][column]
            values = np.abs(step.maps[method])
            low, high = float(np.nanmin(values)), float(np.nanmax(values))
            figures.overlay(panel, crop, values, "inferno", low, high if high > low else low + 1e-12, alpha=0.7)
            panel.set_xticks([])
            panel.set_yticks([])
            if row == 0:
                panel.set_title(step.name, fontsize=6)
            if column == 0:
                panel.set_ylabel(method, fontsize=8)
        grid = panels[row][-2].get_subplotspec().get_gridspec()
        panels[row][-2].remove()
        panels[row][-1].remove()
        curves = fig.add_subplot(grid[row, -2:])  # the last two columns
        steps = range(len(cascade))
        for key, label in (("spearman_abs", "Spearman |map|"), ("spearman_signed", "Spearman map"), ("ssim", "SSIM")):
            curves.plot(steps, [getattr(step.similarity[method], key) for step in cascade], marker=".", label=label)
        curves.axhline(result.threshold, color="gray", linestyle="--", linewidth=0.8)
        curves.set_ylim(-1.05, 1.05)
        curves.set_xlabel("cascading step", fontsize=7)
        curves.tick_params(labelsize=6)
        if row == 0:
            curves.legend(fontsize=6)
    note = _note(weights_label)
    title = "sanity: |map| after each cascading randomisation step, each on its own scale"
    figures.title(fig, title + (f"\n{note}" if note else ""), weights_label)
    return fig
