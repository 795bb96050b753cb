"""Linear-probe results as tables, one row per image, JSON, a confusion-matrix figure and summary numbers."""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from vitcli.experiments.probe import ProbeResult
from vitcli.filenames import escaped_path
from vitcli.render import weights_caption

MISTAKES_SHOWN = 10


def table(result: ProbeResult) -> Group:
    facts = Table(
        title=f"linear probe on {result.model_name} features: {result.root}",
        caption=Text.assemble(weights_caption(result.weights), " (backbone, frozen)"),
        show_header=False,
    )
    facts.add_column("fact")
    facts.add_column("value", justify="right")
    counts = ", ".join(f"{name} {count}" for name, count in zip(result.classes, result.class_counts, strict=True))
    train = sum(1 for image in result.images if image.split == "train")
    facts.add_row("classes (images)", counts)
    split = f"{train} train, {len(result.images) - train} val (fraction {result.val_fraction:g}, seed {result.seed})"
    facts.add_row("split (stratified)", split)
    facts.add_row("features", f"{result.new_features} computed, {result.reused_features} from the cache")
    head = result.head
    shape = f"{len(result.classes)} x {head.weight.shape[1]} + bias"
    facts.add_row("head", f"{shape}, weight decay {result.weight_decay:g}, L-BFGS {head.iterations} steps")
    facts.add_row("training loss", f"{head.loss:.4g} (mean cross-entropy + weight decay / 2 x ||W||^2)")
    facts.add_row("train accuracy", f"{result.train_accuracy:.4f}")
    facts.add_row(
        "val accuracy", "no validation split" if result.val_accuracy is None else f"{result.val_accuracy:.4f}"
    )
    confusion = Table(title=f"confusion matrix over the {result.evaluated_on} split (rows: true class)")
    confusion.add_column("true \\ predicted")
    for name in result.classes:
        confusion.add_column(name, justify="right")
    confusion.add_column("accuracy", justify="right")
    for label, line in enumerate(result.confusion):
        accuracy = result.per_class_accuracy[label]
        cells = [str(count) for count in line] + ["" if accuracy is None else f"{accuracy:.4f}"]
        confusion.add_row(result.classes[label], *cells)
    parts: list[Any] = [facts, confusion]
    mistakes = [
        image for image in result.images if image.split == result.evaluated_on and image.predicted != image.label
    ]
    if mistakes:
        wrong = Table(title=f"misclassified ({result.evaluated_on}; first {MISTAKES_SHOWN})")
        for column in ("image", "class", "predicted", "probability"):
            wrong.add_column(column, justify="right" if column == "probability" else "left")
        for image in mistakes[:MISTAKES_SHOWN]:
            wrong.add_row(
                escaped_path(image.path),
                result.classes[image.label],
                result.classes[image.predicted],
                f"{image.probability:.4f}",
            )
        parts.append(wrong)
    return Group(*parts)


def rows(result: ProbeResult) -> list[dict[str, Any]]:
    return [
        {
            "path": escaped_path(image.path),
            "sha256": image.sha256,
            "class": result.classes[image.label],
            "split": image.split,
            "predicted": result.classes[image.predicted],
            "correct": image.predicted == image.label,
            "probability": image.probability,
        }
        for image in result.images
    ]


def document(result: ProbeResult) -> dict[str, Any]:
    return {
        "weights": result.weights,
        "data": str(result.root),
        "classes": result.classes,
        "class_counts": result.class_counts,
        "split": {"seed": result.seed, "val_fraction": result.val_fraction, "stratified": True},
        "head": {
            "classes": len(result.classes),
            "features": int(result.head.weight.shape[1]),
            "weight_decay": result.weight_decay,
            "objective": "mean cross-entropy + weight_decay / 2 * ||W||^2 (bias not decayed), full batch, L-BFGS",
            "loss": result.head.loss,
            "iterations": result.head.iterations,
        },
        "train_accuracy": result.train_accuracy,
        "val_accuracy": result.val_accuracy,
        "evaluated_on": result.evaluated_on,
        "confusion": result.confusion,
        "per_class_accuracy": dict(zip(result.classes, result.per_class_accuracy, strict=True)),
        "features": {"computed": result.new_features, "from_cache": result.reused_features},
        "images": rows(result),
    }


def figure(result: ProbeResult) -> Any:
    """The confusion matrix over the evaluated split, counts written in each cell."""
    from matplotlib.ticker import MaxNLocator

    from vitcli import figures

    count = len(result.classes)
    fig, (panel,) = figures.figure(1, size=max(3.5, 0.6 * count + 2.5))
    matrix = np.array(result.confusion)
    image = panel.imshow(matrix, cmap="Blues", vmin=0, vmax=max(int(matrix.max()), 1))
    panel.set_xticks(range(count), result.classes, rotation=45, ha="right", parse_math=False)  # folder names
    panel.set_yticks(range(count), result.classes, parse_math=False)
    panel.set_xlabel("predicted")
    panel.set_ylabel("true class")
    if count <= 20:
        for row in range(count):
            for col in range(count):
                dark = matrix[row, col] > matrix.max() / 2
                panel.text(
                    col, row, str(matrix[row, col]), ha="center", va="center", color="white" if dark else "black"
                )
    colorbar = fig.colorbar(image, ax=panel, shrink=0.7, label="images")
    colorbar.locator = MaxNLocator(integer=True)  # counts: whole-number ticks only
    colorbar.update_ticks()
    accuracy = result.val_accuracy if result.val_accuracy is not None else result.train_accuracy
    figures.title(
        fig, f"linear probe, {result.evaluated_on} split: accuracy {accuracy:.3f} ({result.model_name})", result.weights
    )
    return fig


def summary(result: ProbeResult) -> dict[str, Any]:
    return {
        "probe_classes": len(result.classes),
        "probe_images": len(result.images),
        "probe_train_accuracy": result.train_accuracy,
        "probe_val_accuracy": result.val_accuracy,
    }
