"""Occlusion: cover pixels of the model input with a fill and measure how the target probability falls.

An embedding target (vitcli.targets) is followed the same way with its score in place of the probability: drops
are then clean - covered score, in the score's own units.

Every cover starts from a fresh copy of the normalized input (`PreparedImage.input`), so covers never accumulate;
only pixels change, never tokens or the attention. Covered copies are built lazily, one batch at a time, so peak
memory is bounded by the batch size, not by the number of covers. Drops are 100 x (clean - covered probability)
in percentage points: positive means the probability fell. What is covered (the quadrants, the sliding windows)
and the drops mapped onto pixels and patches are in covers.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from vitcli.errors import UsageError
from vitcli.experiments.covers import Cover, SlidingWindows, patch_drop_grid, pixel_drop_map, quadrant_covers
from vitcli.experiments.results import ClassProbability, EmbeddingScore, class_probability
from vitcli.grid import PatchGrid
from vitcli.images import ImageSource
from vitcli.model import PreparedImage, VitModel
from vitcli.target_class import resolve_target
from vitcli.targets import BoundTarget, output_of

FILLS = ("gray", "black", "white", "mean", "blur")
# Batching changes float32 sums slightly (about 1e-7 in probability): smaller changes count as "unchanged".
UNCHANGED_PROBABILITY = 1e-6


# ----- fills


def fill_image(model: VitModel, prepared: PreparedImage, fill: str) -> Tensor:
    """The (3, H, W) normalized image whose pixels replace covered ones.

    gray: pixel = the checkpoint's normalization mean (normalized 0); black: pixel 0; white: pixel 1;
    mean: this image's per-channel mean pixel; blur: this image blurred with a Gaussian of sigma = half a patch.
    """
    if fill not in FILLS:
        raise UsageError(f"unknown fill {fill!r}: choose one of {', '.join(FILLS)}")
    image = prepared.input
    if fill == "blur":
        import torchvision.transforms.functional as transforms

        sigma = model.grid.patch_size / 2
        kernel = 2 * math.ceil(3 * sigma) + 1
        # Normalization is a per-channel affine map and the kernel sums to one, so blurring the normalized input
        # equals normalizing the blurred pixels.
        return transforms.gaussian_blur(image.unsqueeze(0), [kernel, kernel], [sigma, sigma]).squeeze(0)
    if fill == "mean":
        return image.mean(dim=(1, 2), keepdim=True).expand_as(image).clone()
    mean = torch.tensor(model.mean).reshape(3, 1, 1)
    std = torch.tensor(model.std).reshape(3, 1, 1)
    pixel = {"gray": mean, "black": torch.zeros(3, 1, 1), "white": torch.ones(3, 1, 1)}[fill]
    return ((pixel - mean) / std).expand_as(image).clone()


def paint(image: Tensor, fill: Tensor, box: tuple[int, int, int, int]) -> None:
    """Replace the box of a (3, H, W) image, in place, by the same box of the fill."""
    left, top, right, bottom = box
    image[:, top:bottom, left:right] = fill[:, top:bottom, left:right]


def covered_copy(image: Tensor, fill: Tensor, cover: Cover) -> Tensor:
    copy = image.clone()
    paint(copy, fill, cover.box)
    return copy


def covered_batches(image: Tensor, fill: Tensor, covers: Sequence[Cover], batch_size: int) -> Iterator[Tensor]:
    """(B, 3, H, W) batches of covered copies, each a fresh copy of the image with one cover painted."""
    for start in range(0, len(covers), batch_size):
        chunk = covers[start : start + batch_size]
        batch = image.expand(len(chunk), *image.shape).clone()
        for copy, cover in zip(batch, chunk, strict=True):
            paint(copy, fill, cover.box)
        yield batch


def covered_row_batches(
    clean: Tensor, fill: Tensor, covers: Sequence[Cover], grid: PatchGrid, batch_size: int
) -> Iterator[Tensor]:
    """(B, N, D) batches of block 1's input rows for covers that are each exactly one patch: the clean image's rows
    with the covered patch's row taken from the fill image's rows (clean and fill are (1, N, D))."""
    for start in range(0, len(covers), batch_size):
        chunk = covers[start : start + batch_size]
        batch = clean.expand(len(chunk), -1, -1).clone()
        rows = torch.tensor([grid.token_of_patch(cover.patch) for cover in chunk])
        batch[torch.arange(len(chunk)), rows] = fill[0, rows]
        yield batch


def pixels_uint8(model: VitModel, image: Tensor) -> np.ndarray:
    """A normalized (3, H, W) image back to (H, W, 3) uint8 pixels, for figures."""
    mean = torch.tensor(model.mean).reshape(3, 1, 1)
    std = torch.tensor(model.std).reshape(3, 1, 1)
    pixels = image * std + mean
    return (pixels.permute(1, 2, 0) * 255).round().clamp(0, 255).to(torch.uint8).numpy()


# ----- measuring


@dataclass(frozen=True)
class CoverOutcome:
    cover: Cover
    target_probability: float  # of the covered image; an embedding target's score instead
    drop: float  # points: 100 x (clean - covered); positive means the probability fell (a score: clean - covered)
    top1: ClassProbability | None  # of the covered image; None when an embedding target is followed
    top1_changed: bool


@dataclass(frozen=True)
class Baseline:
    """The clean image's facts every experiment compares against."""

    source: ImageSource
    weights: str  # the model weights' label
    fill: str
    target: ClassProbability | EmbeddingScore
    top1: ClassProbability | None  # None when an embedding target is followed (the forward ends at the embedding)
    bound: BoundTarget | None = None  # the embedding target being followed


def baseline(
    model: VitModel,
    prepared: PreparedImage,
    target: str | BoundTarget | None,
    fill: str,
    clean_logits: Tensor | None = None,
) -> Baseline:
    """The clean image's target and top-1; `clean_logits` (classes,) saves the clean forward when already run."""
    if isinstance(target, BoundTarget):
        with output_of(model, target):
            pooled = model.logits(prepared.input.unsqueeze(0))
        score = EmbeddingScore(target.target, float(target.score(pooled)[0]))
        return Baseline(prepared.source, model.spec.label, fill, score, None, target)
    if clean_logits is None:
        clean_logits = model.logits(prepared.input.unsqueeze(0))[0]
    clean = model.probabilities(clean_logits)
    index = resolve_target(model, target, clean)
    top = int(clean.argmax())
    return Baseline(
        prepared.source,
        model.spec.label,
        fill,
        class_probability(model.labels, index, clean),
        class_probability(model.labels, top, clean),
    )


def measure_covers(
    model: VitModel,
    image: Tensor,
    fill: Tensor,
    covers: Sequence[Cover],
    base: Baseline,
    on_batch: Callable[[int], None] | None = None,
) -> list[CoverOutcome]:
    """Run every covered copy through the model, `model.batch_size` copies at a time.

    Covers that are each exactly one patch are applied to block 1's input rows (one row changes per cover; the
    patch projection runs twice, not once per cover); other covers are painted on the pixels.
    """
    outcomes = []
    done = 0
    with output_of(model, base.bound):
        for batch_outputs in _covered_outputs(model, image, fill, covers):
            if base.bound is not None:
                scores = base.bound.score(batch_outputs)
                for row, covered in enumerate(scores.tolist()):
                    outcomes.append(CoverOutcome(covers[done + row], covered, base.target.score - covered, None, False))
            else:
                outcomes += _class_outcomes(model, batch_outputs, covers[done:], base)
            done += len(batch_outputs)
            if on_batch is not None:
                on_batch(len(batch_outputs))
    return outcomes


def _covered_outputs(model: VitModel, image: Tensor, fill: Tensor, covers: Sequence[Cover]) -> Iterator[Tensor]:
    if model.embeds_patches_alone and all(cover.patch is not None for cover in covers):
        with torch.inference_mode():
            clean_rows, fill_rows = model.embed(torch.stack([image, fill]).to(model.device)).cpu().split(1)
        batches = covered_row_batches(clean_rows, fill_rows, covers, model.grid, model.batch_size)
        return model.stream(model.rows_logits, batches)
    return model.stream(model.image_logits, covered_batches(image, fill, covers, model.batch_size))


def _class_outcomes(model: VitModel, logits: Tensor, covers: Sequence[Cover], base: Baseline) -> list[CoverOutcome]:
    probabilities = model.probabilities(logits)
    best = probabilities.max(dim=-1)
    outcomes = []
    for row in range(len(probabilities)):
        covered = float(probabilities[row, base.target.index])
        top = int(best.indices[row])
        outcomes.append(
            CoverOutcome(
                covers[row],
                covered,
                100.0 * (base.target.probability - covered),
                ClassProbability(top, model.labels[top], float(best.values[row])),
                top != base.top1.index,
            )
        )
    return outcomes


def largest_drop(outcomes: Sequence[CoverOutcome]) -> CoverOutcome:
    return max(outcomes, key=lambda outcome: outcome.drop)


# ----- occlude-quadrants


@dataclass
class QuadrantOcclusion:
    base: Baseline
    outcomes: list[CoverOutcome]  # one per quadrant, in QUADRANTS order
    crop: np.ndarray  # (H, W, 3) uint8: the clean input the model saw
    covered_crops: list[np.ndarray]  # (H, W, 3) uint8 per outcome: the input with that quadrant covered

    @property
    def largest(self) -> CoverOutcome:
        return largest_drop(self.outcomes)


def occlude_quadrants(
    model: VitModel,
    prepared: PreparedImage,
    target: str | BoundTarget | None,
    fill: str,
    clean_logits: Tensor | None = None,
) -> QuadrantOcclusion:
    base = baseline(model, prepared, target, fill, clean_logits)
    covers = quadrant_covers(model.grid)
    fill_pixels = fill_image(model, prepared, fill)
    return QuadrantOcclusion(
        base,
        measure_covers(model, prepared.input, fill_pixels, covers, base),
        prepared.crop_uint8(),
        [pixels_uint8(model, covered_copy(prepared.input, fill_pixels, cover)) for cover in covers],
    )


# ----- occlude-patches


@dataclass(frozen=True)
class DropCounts:
    """How the covers moved the target probability."""

    lowered: int  # covers that lowered it by more than UNCHANGED_PROBABILITY
    raised: int
    unchanged: int
    min_covered_probability: float
    max_covered_probability: float
    top1_changed_covers: int


def drop_counts(outcomes: Sequence[CoverOutcome]) -> DropCounts:
    unchanged = 100.0 * UNCHANGED_PROBABILITY
    drops = [outcome.drop for outcome in outcomes]
    probabilities = [outcome.target_probability for outcome in outcomes]
    return DropCounts(
        sum(drop > unchanged for drop in drops),
        sum(drop < -unchanged for drop in drops),
        sum(abs(drop) <= unchanged for drop in drops),
        min(probabilities),
        max(probabilities),
        sum(outcome.top1_changed for outcome in outcomes),
    )


@dataclass
class PatchOcclusion:
    """Sliding-window covers over one image: every cover's outcome, and the drops mapped onto pixels and patches."""

    base: Baseline
    grid: PatchGrid
    windows: SlidingWindows
    outcomes: list[CoverOutcome]  # one per window, row by row
    counts: DropCounts
    pixel_map: Tensor  # (H, W) float64 points: mean drop of the windows covering each pixel, NaN under none
    drop_grid: Tensor  # (grid rows, grid cols) float64 points: the pixel map's mean over each patch
    crop: np.ndarray  # (H, W, 3) uint8: the input the model saw

    @property
    def largest(self) -> CoverOutcome:
        return largest_drop(self.outcomes)

    @property
    def uncovered_pixels(self) -> int:
        return int(self.pixel_map.isnan().sum())


def occlude_patches(
    model: VitModel,
    prepared: PreparedImage,
    windows: SlidingWindows,
    target: str | BoundTarget | None,
    fill: str,
    on_batch: Callable[[int], None] | None = None,
    clean_logits: Tensor | None = None,
) -> PatchOcclusion:
    base = baseline(model, prepared, target, fill, clean_logits)
    covers = list(windows)
    outcomes = measure_covers(model, prepared.input, fill_image(model, prepared, fill), covers, base, on_batch)
    pixel_map = pixel_drop_map(covers, [outcome.drop for outcome in outcomes], windows.grid)
    return PatchOcclusion(
        base,
        windows.grid,
        windows,
        outcomes,
        drop_counts(outcomes),
        pixel_map,
        patch_drop_grid(pixel_map, windows.grid),
        prepared.crop_uint8(),
    )
