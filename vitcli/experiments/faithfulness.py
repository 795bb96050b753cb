"""Deletion and insertion curves: does covering the patches a map ranks highest make the target probability fall?

A map on the patch grid orders the patches by decreasing value (ties by patch number). Deletion covers the first
k patches of that order with the fill, insertion starts from the fully covered image and reveals the first k; the
target probability is measured at k = floor(s * P / S) patches for s = 0..S (S = steps, P = patches). The area under
each curve is the trapezoidal area over the fraction k / P from 0 to 1, the unperturbed point included (deletion's
first, insertion's last). Random orders drawn from a seeded generator give the baseline. Every perturbed copy runs
through the model's own forward, `model.batch_size` copies at a time. An embedding target (vitcli.targets) is
measured by its score in place of the probability.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from vitcli.errors import UsageError
from vitcli.grid import PatchGrid
from vitcli.model import VitModel
from vitcli.spec import MAX_RANDOM_ORDERS, check_count, check_seed
from vitcli.targets import BoundTarget, output_of

DEFINITION = (
    "deletion: patches covered with the fill in order of decreasing map value (ties by patch number), "
    "target probability after each step; insertion: from the fully covered image, patches revealed in the same "
    "order; AUC: trapezoidal area under the probability over the fraction of patches from 0 to 1, the unperturbed "
    "point included; lower deletion AUC and higher insertion AUC are better"
)
RANDOM = "random-orders"  # the baseline of random patch orders (not the `random` method's map)


@dataclass(frozen=True)
class FaithfulnessOptions:
    steps: int  # S: points after the unperturbed one; S = P moves one patch per step
    random_orders: int = 5  # orders averaged for the baseline; 0 leaves it out
    seed: int = 0


@dataclass
class Curve:
    fractions: np.ndarray  # (S + 1,) fraction of patches covered (deletion) or revealed (insertion), 0 to 1
    probabilities: np.ndarray  # (S + 1,) target probability at each fraction
    auc: float  # trapezoidal area under probabilities over fractions


@dataclass
class MethodCurves:
    method: str
    order: list[int]  # patch numbers, most relevant first
    deletion: Curve
    insertion: Curve


@dataclass
class RandomBaseline:
    orders: int
    seed: int
    deletion: Curve  # mean probability over the orders at each fraction; auc = mean of the orders' AUCs
    insertion: Curve
    deletion_spread: np.ndarray  # (S + 1,) standard deviation over the orders at each fraction (ddof 0)
    insertion_spread: np.ndarray
    deletion_aucs: np.ndarray  # (orders,) one AUC per order
    insertion_aucs: np.ndarray


@dataclass
class Faithfulness:
    target: int | str  # the class index, or an embedding target's short description
    clean_probability: float  # the unperturbed image: deletion's first point, insertion's last
    covered_probability: float  # every patch covered: deletion's last point, insertion's first
    steps: int
    patches: int
    methods: list[MethodCurves]
    random: RandomBaseline | None
    definition: str = DEFINITION
    measure: str = "probability"  # what the curves follow: the target probability, or an embedding target's score

    def ranking(self) -> list[tuple[str, int, int]]:
        """(method, deletion rank, insertion rank) for the maps and the random baseline; rank 1 is most faithful.

        Equal AUCs share a rank, the best of their places (competition ranking: 1, 1, 3), so list order never
        decides between methods the curves cannot tell apart."""
        entries = [(curves.method, curves.deletion.auc, curves.insertion.auc) for curves in self.methods]
        if self.random is not None:
            entries.append((RANDOM, self.random.deletion.auc, self.random.insertion.auc))
        deletion = [auc for _, auc, _ in entries]
        insertion = [auc for _, _, auc in entries]
        return [
            (method, 1 + sum(other < low for other in deletion), 1 + sum(other > high for other in insertion))
            for method, low, high in entries
        ]


def trapezoid_auc(fractions: Sequence[float] | np.ndarray, values: Sequence[float] | np.ndarray) -> float:
    """Trapezoidal area under values over fractions (written out: numpy renamed trapz to trapezoid in 2.0)."""
    x = np.asarray(fractions, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))


def check_options(grid: PatchGrid, options: FaithfulnessOptions) -> None:
    if not 1 <= options.steps <= grid.num_patches:
        raise UsageError(f"--steps must be between 1 and {grid.num_patches} (the patches), not {options.steps}")
    check_count("--random-orders", options.random_orders, 0, MAX_RANDOM_ORDERS, "each order costs 2 x --steps forwards")
    check_seed("--order-seed", options.seed)


def step_counts(patches: int, steps: int) -> list[int]:
    """Patches perturbed at each of the S + 1 points: floor(s * P / S)."""
    return [step * patches // steps for step in range(steps + 1)]


def count_forwards(methods: int, options: FaithfulnessOptions) -> int:
    """Forwards `faithfulness` runs, for a progress bar: the clean and fully covered images, then the inner points."""
    return 2 + 2 * (methods + options.random_orders) * (options.steps - 1)


def relevance_order(values: np.ndarray | Tensor) -> Tensor:
    """Zero-based patch indexes by decreasing value; ties keep patch order, NaN (no value) comes last."""
    flat = torch.as_tensor(np.asarray(values, dtype=np.float64)).reshape(-1)
    flat = torch.where(flat.isnan(), torch.tensor(-math.inf, dtype=flat.dtype), flat)
    return torch.sort(-flat, stable=True).indices


def faithfulness(
    model: VitModel,
    image: Tensor,
    fill: Tensor,
    maps: Mapping[str, np.ndarray],
    target: int | BoundTarget,
    options: FaithfulnessOptions,
    on_progress: Callable[[int], None] | None = None,
) -> Faithfulness:
    """Deletion and insertion curves of each (rows, cols) map for one (3, H, W) normalized image and its fill."""
    grid = model.map_grid
    check_options(grid, options)
    if fill.shape != image.shape:
        raise ValueError(f"fill {tuple(fill.shape)} and image {tuple(image.shape)} differ in shape")
    counts = step_counts(grid.num_patches, options.steps)
    generator = torch.Generator().manual_seed(options.seed)
    random_orders = [torch.randperm(grid.num_patches, generator=generator) for _ in range(options.random_orders)]
    orders = [relevance_order(values) for values in maps.values()] + random_orders

    # The endpoints are the same image for every order: the clean one and the fully covered one.
    everything = torch.ones(grid.num_patches, dtype=torch.bool)
    jobs = [everything.logical_not(), everything]
    for order in orders:
        for count in counts[1:-1]:
            covered = torch.zeros(grid.num_patches, dtype=torch.bool)
            covered[order[:count]] = True
            jobs.extend([covered, covered.logical_not()])  # deletion covers the first `count`, insertion the rest
    probabilities = _target_probabilities(model, image, fill, jobs, target, on_progress)
    clean, fully_covered = float(probabilities[0]), float(probabilities[1])
    inner = probabilities[2:].reshape(len(orders), len(counts) - 2, 2)
    fractions = np.array(counts, dtype=np.float64) / grid.num_patches

    def curve(values: Tensor, first: float, last: float) -> Curve:
        points = np.concatenate([[first], values.double().numpy(), [last]])
        return Curve(fractions, points, trapezoid_auc(fractions, points))

    curves = [
        (curve(inner[index, :, 0], clean, fully_covered), curve(inner[index, :, 1], fully_covered, clean))
        for index in range(len(orders))
    ]
    methods = [MethodCurves(method, (orders[index] + 1).tolist(), *curves[index]) for index, method in enumerate(maps)]
    random = _random_baseline(curves[len(maps) :], fractions, options) if random_orders else None
    if isinstance(target, BoundTarget):
        followed, definition = target.target.short, DEFINITION.replace("target probability", target.target.unit)
        return Faithfulness(
            followed,
            clean,
            fully_covered,
            options.steps,
            grid.num_patches,
            methods,
            random,
            definition.replace("probability over", "score over"),
            target.target.unit,
        )
    return Faithfulness(target, clean, fully_covered, options.steps, grid.num_patches, methods, random)


def _random_baseline(curves: list[tuple[Curve, Curve]], fractions: np.ndarray, options: FaithfulnessOptions):
    deletions = np.stack([deletion.probabilities for deletion, _ in curves])
    insertions = np.stack([insertion.probabilities for _, insertion in curves])
    deletion_aucs = np.array([deletion.auc for deletion, _ in curves])
    insertion_aucs = np.array([insertion.auc for _, insertion in curves])
    return RandomBaseline(
        options.random_orders,
        options.seed,
        Curve(fractions, deletions.mean(axis=0), float(deletion_aucs.mean())),
        Curve(fractions, insertions.mean(axis=0), float(insertion_aucs.mean())),
        deletions.std(axis=0),
        insertions.std(axis=0),
        deletion_aucs,
        insertion_aucs,
    )


def pixel_mask(grid: PatchGrid, covered: Tensor) -> Tensor:
    """(H, W) bool: True on the pixels of the covered patches; pixels outside the patch grid are never covered."""
    size = grid.patch_size
    cells = covered.reshape(grid.rows, grid.cols).repeat_interleave(size, 0).repeat_interleave(size, 1)
    mask = torch.zeros(grid.image_height, grid.image_width, dtype=torch.bool)
    mask[: cells.shape[0], : cells.shape[1]] = cells
    return mask


def perturbed_batches(image: Tensor, fill: Tensor, grid: PatchGrid, jobs: Sequence[Tensor], size: int) -> Iterator:
    """(B, 3, H, W) copies of the image with each job's covered patches replaced by the fill, built lazily."""
    for start in range(0, len(jobs), size):
        masks = torch.stack([pixel_mask(grid, covered) for covered in jobs[start : start + size]])
        yield torch.where(masks[:, None], fill, image)


def _target_probabilities(model, image, fill, jobs, target, on_progress) -> Tensor:
    """The target probability of each perturbed copy (an embedding target's score instead)."""
    results = []
    batches = perturbed_batches(image, fill, model.map_grid, jobs, model.batch_size)
    with output_of(model, target):
        for outputs in model.stream(model.image_logits, batches):
            if isinstance(target, BoundTarget):
                results.append(target.score(outputs))
            else:
                results.append(model.probabilities(outputs)[:, target])
            if on_progress is not None:
                on_progress(len(outputs))
    return torch.cat(results)


# ----- over many images


@dataclass(frozen=True)
class MethodSpread:
    method: str
    images: int
    deletion_mean: float
    deletion_std: float  # sample standard deviation (ddof 1) over the images; 0 for one image
    insertion_mean: float
    insertion_std: float


def faithfulness_spread(results: Sequence[Faithfulness]) -> list[MethodSpread]:
    """Mean and spread of each method's AUCs (and the random baseline's mean AUC) over images, in first-seen order."""
    aucs: dict[str, list[tuple[float, float]]] = {}
    for result in results:
        for curves in result.methods:
            aucs.setdefault(curves.method, []).append((curves.deletion.auc, curves.insertion.auc))
        if result.random is not None:
            aucs.setdefault(RANDOM, []).append((result.random.deletion.auc, result.random.insertion.auc))
    spreads = []
    for method, values in aucs.items():
        deletion, insertion = np.array(values).T
        ddof = 1 if len(values) > 1 else 0
        spreads.append(
            MethodSpread(
                method,
                len(values),
                float(deletion.mean()),
                float(deletion.std(ddof=ddof)),
                float(insertion.mean()),
                float(insertion.std(ddof=ddof)),
            )
        )
    return spreads
