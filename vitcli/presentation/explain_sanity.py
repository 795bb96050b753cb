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


# Readable at 100% zoom on a laptop: at most COLUMNS maps of PANEL inches per row, so the figure stays within about
# 1,500 px at the saved 150 dpi however deep the model; the rows wrap instead.
COLUMNS = 5
PANEL = 2.0
CURVES = 2.4  # inches of height for each method's similarity curves
TITLE_SIZE = 10
TEXT_SIZE = 9


def _step_title(name: str) -> str:
    """The step's name, "+ embeddings" on a line of its own so a panel's title stays within its width."""
    return name.replace(" + ", "\n+ ")


def figure(result: Sanity, crop: np.ndarray, weights_label: str) -> Any:
    """Per method: |map| after each cascading step (each on its own scale), COLUMNS to a row, then the similarity
    curves over the steps."""
    from vitcli import figures

    methods = list(result.steps[0].maps)
    cascade = [step for step in result.steps if step.kind in ("original", "cascading")]
    columns = min(COLUMNS, len(cascade))
    rows = -(-len(cascade) // columns)
    section = rows * (PANEL + 0.3) + CURVES + 0.5
    fig = figures.plt.figure(figsize=(PANEL * max(columns, 4), section * len(methods) + 1.0), layout="constrained")
    sections = fig.subfigures(len(methods), 1, squeeze=False)[:, 0]
    for method, part in zip(methods, sections, strict=True):
        part.suptitle(method, fontsize=12, fontweight="bold")
        grid = part.add_gridspec(rows + 1, columns, height_ratios=[PANEL] * rows + [CURVES])
        for index, step in enumerate(cascade):
            panel = part.add_subplot(grid[index // columns, index % columns])
            values = np.abs(step.maps[method])
            low, high = float(np.nanmin(values)), float(np.nanmax(values))
            figures.overlay(panel, crop, values, "inferno", low, high if high > low else low + 1e-12, alpha=0.7)
            panel.set_xticks([])
            panel.set_yticks([])
            panel.set_title(_step_title(step.name), fontsize=TITLE_SIZE)
        curves = part.add_subplot(grid[rows, :])
        steps = range(len(cascade))
        for key, label in (("spearman_abs", "Spearman |map|"), ("spearman_signed", "Spearman map"), ("ssim", "SSIM")):
            curves.plot(steps, [getattr(step.similarity[method], key) for step in cascade], marker=".", label=label)
        curves.axhline(result.threshold, color="gray", linestyle="--", linewidth=0.8, label="pass threshold")
        curves.set_ylim(-1.05, 1.05)
        curves.set_xticks(list(steps))
        curves.set_xlabel("cascading step (0: original; the panels above in order)", fontsize=TEXT_SIZE)
        curves.set_ylabel("similarity", fontsize=TEXT_SIZE)
        curves.tick_params(labelsize=TEXT_SIZE)
        curves.legend(fontsize=TEXT_SIZE, loc="best", ncols=4)
    note = _note(weights_label)
    title = "sanity: |map| after each cascading randomisation step, each on its own scale"
    figures.title(fig, title + (f"\n{note}" if note else ""), weights_label)
    return fig
