"""How far does a map move under a tiny change of the input? Max- and average-sensitivity (Yeh et al. 2019).

For each of `samples` perturbations delta, drawn uniformly from [-r, r] per normalized input value, the map Phi
(the (rows, cols) patch map, target class fixed) is recomputed on x + delta with every other setting unchanged:

    sensitivity = ||Phi(x + delta) - Phi(x)||_F / ||Phi(x)||_F   (a zero norm divides by 1, as captum does)

max-sensitivity is the largest over the samples (captum.metrics.sensitivity_max), average sensitivity their mean.
r is stated as a fraction of the pixel range [0, 1]: per channel r / std in normalized units (0.02 / 0.5 = 0.04 for
ViT-Tiny). The perturbations come from a generator seeded with the seed alone, so `perturbations()` replays them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from vitcli.experiments.explain import MapSettings, MethodMap, method_maps
from vitcli.model import PreparedImage, VitModel


@dataclass
class MethodSensitivity:
    method: str
    sensitivities: np.ndarray  # (samples,) one ratio per perturbation, in drawing order

    @property
    def max(self) -> float:
        return float(self.sensitivities.max())

    @property
    def mean(self) -> float:
        return float(self.sensitivities.mean())


@dataclass
class Robustness:
    radius: float  # fraction of the pixel range
    normalized_radius: list[float]  # per channel: radius / std
    samples: int
    seed: int
    methods: list[MethodSensitivity]


def perturbations(model: VitModel, shape: Sequence[int], radius: float, samples: int, seed: int) -> Tensor:
    """(samples, 3, H, W) deltas uniform in [-radius / std_c, radius / std_c], from a generator seeded with `seed`."""
    generator = torch.Generator().manual_seed(seed)
    unit = torch.rand((samples, *shape), generator=generator, dtype=torch.float32) * 2 - 1
    return unit * (radius / torch.tensor(model.std, dtype=torch.float32)).reshape(3, 1, 1)


def sensitivity(original: np.ndarray, perturbed: np.ndarray) -> float:
    norm = float(np.linalg.norm(original))
    return float(np.linalg.norm(perturbed - original)) / (norm if norm != 0 else 1.0)


def robustness(
    model: VitModel,
    prepared: PreparedImage,
    maps: Sequence[MethodMap],
    target: int,
    settings: MapSettings,
    radius: float,
    samples: int,
    seed: int,
    on_progress: Callable[[int], None] | None = None,
) -> Robustness:
    """Sensitivities of the given maps (computed on the clean image) under `samples` seeded perturbations."""
    methods = [item.method for item in maps]
    deltas = perturbations(model, prepared.input.shape, radius, samples, seed)
    ratios = np.zeros((len(methods), samples))
    for index, delta in enumerate(deltas):
        moved = replace(prepared, input=prepared.input + delta)
        recomputed, _ = method_maps(model, moved, methods, target, settings, on_progress)
        for row, (before, after) in enumerate(zip(maps, recomputed, strict=True)):
            ratios[row, index] = sensitivity(before.values, after.values)
    return Robustness(
        radius,
        [radius / std for std in model.std],
        samples,
        seed,
        [MethodSensitivity(method, ratios[row]) for row, method in enumerate(methods)],
    )
