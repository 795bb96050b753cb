"""ROAD: RemOve And Debias (Rong, Leemann, Borisov, Kasneci and Kasneci, ICML 2022).

Deletion curves leak the shape of the removed region (a gray square is itself evidence); ROAD fills the removed
pixels by noisy linear imputation from their neighbours instead. At each p in PERCENTS, MoRF removes the most relevant
patches and LeRF the least relevant; the target probability of the imputed image is recorded. The combined score is
(mean over p of LeRF - mean over p of MoRF) / 2; higher is better.

Which patches go (TIE_POLICY) is pytorch-grad-cam's rule on the map drawn at pixel resolution (each patch's value on
each of its pixels): MoRF removes every pixel whose value is at least numpy.percentile(pixel values, 100 - p), so
tied patches are removed together, never in patch-number order, and a tie at the cut can take more than p% (a map
whose minimum covers over 100 - p% of it loses everything). LeRF is the same rule on the negated map (pytorch-grad-cam
negates as 1 - map: the same for maps in [0, 1] up to rounding). With the same percentiles, imputation, noise and
softmax target, the curves and the combined score therefore equal pytorch-grad-cam's ROADMostRelevantFirst,
ROADLeastRelevantFirst and ROADCombined given that pixel map (its differences from the clean score cancel in the
combined score).

Imputation (the paper's published imputer): every removed pixel equals the weighted mean of its 8 neighbours inside
the image (weights 1/6 for the 4 direct, 1/12 for the 4 diagonal ones), removed neighbours being unknowns too; the
sparse linear system is solved per channel, then Gaussian noise of standard deviation 0.01 (normalized units) is added
to the removed pixels. The noise of each imputed image is drawn from a generator seeded with the seed alone, so every
map meets the same noise at the same p.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from vitcli.experiments.faithfulness import pixel_mask
from vitcli.model import VitModel
from vitcli.targets import BoundTarget, output_of

PERCENTS = tuple(range(10, 100, 10))
NOISE = 0.01
TIE_POLICY = (
    "ties removed together: at p, MoRF removes every patch whose value is at least numpy.percentile (linear) of the "
    "map's pixel values (each patch's value once per pixel) at 100 - p, LeRF the same on the negated map, as "
    "pytorch-grad-cam's RemoveMostRelevantFirst and RemoveLeastRelevantFirst; a tie at the cut can take more than "
    "p%; NaN counts as below every value"
)
NEIGHBOURS = (
    ((1, 1), 1 / 12),
    ((0, 1), 1 / 6),
    ((-1, 1), 1 / 12),
    ((1, -1), 1 / 12),
    ((0, -1), 1 / 6),
    ((-1, -1), 1 / 12),
    ((1, 0), 1 / 6),
    ((-1, 0), 1 / 6),
)


@dataclass
class MethodRoad:
    method: str
    morf: np.ndarray  # (len(percents),) target probability with the most relevant p% imputed
    lerf: np.ndarray  # (len(percents),) with the least relevant p% imputed
    morf_patches: list[int]  # patches MoRF removed at each percent: about p%, more when a tie straddles the cut
    lerf_patches: list[int]

    @property
    def combined(self) -> float:
        return float((self.lerf.mean() - self.morf.mean()) / 2)


@dataclass
class Road:
    percents: list[int]
    seed: int
    noise: float
    clean_probability: float
    methods: list[MethodRoad]
    tie_policy: str = TIE_POLICY


def impute(image: Tensor, removed: Tensor, noise: float, generator: torch.Generator) -> Tensor:
    """A (C, H, W) image with the pixels where `removed` (H, W) is True filled by noisy linear imputation."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.linalg import spsolve

    channels, height, width = image.shape
    missing = removed.numpy().reshape(-1)
    pixels = image.double().numpy().reshape(channels, -1)
    unknowns = np.flatnonzero(missing)
    if unknowns.size == 0:
        return image.clone()
    variable = np.full(missing.size, -1)
    variable[unknowns] = np.arange(unknowns.size)
    rows, cols = np.divmod(unknowns, width)
    entries_row, entries_col, entries_value = [], [], []
    diagonal = np.zeros(unknowns.size)
    right = np.zeros((unknowns.size, channels))
    for (down, across), weight in NEIGHBOURS:
        y, x = rows + down, cols + across
        inside = (y >= 0) & (y < height) & (x >= 0) & (x < width)
        equation = np.flatnonzero(inside)
        neighbour = y[inside] * width + x[inside]
        diagonal[equation] -= weight
        unknown = missing[neighbour]
        entries_row.append(equation[unknown])
        entries_col.append(variable[neighbour[unknown]])
        entries_value.append(np.full(int(unknown.sum()), weight))
        right[equation[~unknown]] -= weight * pixels[:, neighbour[~unknown]].T
    entries_row.append(np.arange(unknowns.size))
    entries_col.append(np.arange(unknowns.size))
    entries_value.append(diagonal)
    system = coo_matrix(
        (np.concatenate(entries_value), (np.concatenate(entries_row), np.concatenate(entries_col))),
        shape=(unknowns.size, unknowns.size),
    ).tocsc()
    solution = torch.from_numpy(np.asarray(spsolve(system, right)).reshape(unknowns.size, channels)).float()
    filled = image.reshape(channels, -1).clone()
    filled[:, unknowns] = solution.T + noise * torch.randn((channels, unknowns.size), generator=generator)
    return filled.reshape(image.shape)


def removed_patches(values: np.ndarray, patch_pixels: int, percent: int) -> tuple[np.ndarray, np.ndarray]:
    """(MoRF, LeRF) bool arrays over the patches removed at `percent`: TIE_POLICY's threshold rule."""
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    missing = np.isnan(flat)
    if missing.any():  # below every value, so ranked last as in the deletion curves
        low = float(flat[~missing].min()) if (~missing).any() else 0.0
        flat = np.where(missing, low - 1 - abs(low), flat)
    pixels = np.repeat(flat, patch_pixels)

    def at_least_percentile(scores: np.ndarray, pixel_scores: np.ndarray) -> np.ndarray:
        return scores >= np.percentile(pixel_scores, 100 - percent)

    return at_least_percentile(flat, pixels), at_least_percentile(-flat, -pixels)


def removal_masks(model: VitModel, values: np.ndarray, percents: Sequence[int]) -> list[tuple[Tensor, Tensor]]:
    """(MoRF, LeRF) pixel masks of the removed patches at each percent."""
    patch_pixels = model.map_grid.patch_size**2
    masks = []
    for percent in percents:
        most, least = removed_patches(values, patch_pixels, percent)
        masks.append(
            (pixel_mask(model.map_grid, torch.from_numpy(most)), pixel_mask(model.map_grid, torch.from_numpy(least)))
        )
    return masks


def road(
    model: VitModel,
    image: Tensor,
    maps: Mapping[str, np.ndarray],
    target: int | BoundTarget,
    seed: int,
    percents: Sequence[int] = PERCENTS,
    clean_probability: float | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> Road:
    """MoRF and LeRF curves of each (rows, cols) map for one (3, H, W) normalized image; an embedding target's
    score (vitcli.targets) takes the probability's place."""
    imputed, counts = [], []
    patch_pixels = model.map_grid.patch_size**2
    for values in maps.values():
        for most, least in removal_masks(model, values, percents):
            for removed in (most, least):
                imputed.append(impute(image, removed, NOISE, torch.Generator().manual_seed(seed)))
                counts.append(int(removed.sum()) // patch_pixels)
    probabilities = []
    batches = torch.stack(imputed).split(model.batch_size)
    with output_of(model, target):
        for outputs in model.stream(model.image_logits, batches):
            probabilities.append(_measure(model, outputs, target))
            if on_progress is not None:
                on_progress(len(outputs))
    curves = torch.cat(probabilities).double().numpy().reshape(len(maps), len(percents), 2)
    removed = np.array(counts).reshape(len(maps), len(percents), 2)
    if clean_probability is None:
        with output_of(model, target):
            clean_probability = float(_measure(model, model.logits(image[None]), target)[0])
    methods = [
        MethodRoad(method, curves[index, :, 0], curves[index, :, 1], *(removed[index].T.tolist()))
        for index, method in enumerate(maps)
    ]
    return Road(list(percents), seed, NOISE, clean_probability, methods)


def _measure(model: VitModel, outputs: Tensor, target: int | BoundTarget) -> Tensor:
    """The target probability of each output row, or an embedding target's score of pooled embeddings."""
    return target.score(outputs) if isinstance(target, BoundTarget) else model.probabilities(outputs)[:, target]
