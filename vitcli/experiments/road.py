"""ROAD: RemOve And Debias (Rong, Leemann, Borisov, Kasneci and Kasneci, ICML 2022).

Deletion curves leak the shape of the removed region (a gray square is itself evidence); ROAD fills the removed
pixels by noisy linear imputation from their neighbours instead. At each p in PERCENTS, MoRF removes the p% most
relevant patches (floor(p P / 100) of the map's order: decreasing value, ties by patch number) and LeRF the p% least
relevant; the target probability of the imputed image is recorded. The combined score is
(mean over p of LeRF - mean over p of MoRF) / 2, as pytorch-grad-cam's ROADCombined (its differences from the clean
score cancel); higher is better.

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

from vitcli.experiments.faithfulness import pixel_mask, relevance_order
from vitcli.model import VitModel

PERCENTS = tuple(range(10, 100, 10))
NOISE = 0.01
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

    @property
    def combined(self) -> float:
        return float((self.lerf.mean() - self.morf.mean()) / 2)


@dataclass
class Road:
    percents: list[int]
    patches: list[int]  # patches removed at each percent
    seed: int
    noise: float
    clean_probability: float
    methods: list[MethodRoad]


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


def removal_masks(model: VitModel, values: np.ndarray, percents: Sequence[int]) -> list[tuple[Tensor, Tensor]]:
    """(MoRF, LeRF) pixel masks of the removed patches at each percent."""
    order = relevance_order(values)
    patches = model.grid.num_patches
    masks = []
    for percent in percents:
        count = percent * patches // 100
        most, least = torch.zeros(patches, dtype=torch.bool), torch.zeros(patches, dtype=torch.bool)
        most[order[:count]] = True
        least[order[patches - count :]] = True
        masks.append((pixel_mask(model.grid, most), pixel_mask(model.grid, least)))
    return masks


def road(
    model: VitModel,
    image: Tensor,
    maps: Mapping[str, np.ndarray],
    target: int,
    seed: int,
    percents: Sequence[int] = PERCENTS,
    clean_probability: float | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> Road:
    """MoRF and LeRF curves of each (rows, cols) map for one (3, H, W) normalized image."""
    imputed = []
    for values in maps.values():
        for most, least in removal_masks(model, values, percents):
            for removed in (most, least):
                imputed.append(impute(image, removed, NOISE, torch.Generator().manual_seed(seed)))
    probabilities = []
    batches = torch.stack(imputed).split(model.batch_size)
    for logits in model.stream(model.image_logits, batches):
        probabilities.append(logits.softmax(dim=-1)[:, target])
        if on_progress is not None:
            on_progress(len(logits))
    curves = torch.cat(probabilities).double().numpy().reshape(len(maps), len(percents), 2)
    if clean_probability is None:
        clean_probability = float(model.logits(image[None])[0].softmax(dim=-1)[target])
    methods = [MethodRoad(method, curves[index, :, 0], curves[index, :, 1]) for index, method in enumerate(maps)]
    counts = [percent * model.grid.num_patches // 100 for percent in percents]
    return Road(list(percents), counts, seed, NOISE, clean_probability, methods)
