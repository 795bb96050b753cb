"""The accumulators behind `anatomy_images.measure`: each view fed one batch at a time, then finished once.

A batch reaches them as a `Reading`: the rows leaving every block (and the final norm of the last one), plus every
block's attention probabilities when a view asked for them. Numbers stay per image (distance, norms), as Gram sums
(CKA) or as the last block's patch rows (PCA, which needs the folder's components before any image can be mapped).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from vitcli.experiments.anatomy_math import MinibatchCka, Moments, attention_distance, min_max
from vitcli.experiments.anatomy_types import (
    CKA_EXAMPLE,
    CKA_MIN_IMAGES,
    DISTANCE_NOTE,
    NORMS_NOTE,
    PCA_FEATURES,
    CkaResult,
    DistanceResult,
    NormOutlier,
    NormsResult,
    PcaResult,
)
from vitcli.grid import PatchGrid
from vitcli.images import ImageSource


@dataclass
class Reading:
    """What one forward over a batch of B images left for the views."""

    residual: list[Tensor]  # per block (one-based b at index b - 1): (B, N, D) rows leaving the block, CPU float32
    final: Tensor  # (B, N, D) the last block's rows after the model's final norm
    attention: list[Tensor] | None  # per block: (B, heads, N, N) softmax(q k^T * scale); None when not read


class DistanceAccumulator:
    def __init__(self, grid: PatchGrid):
        self.grid = grid
        self.per_image: list[np.ndarray] = []  # (blocks, heads) per image

    def add(self, reading: Reading) -> None:
        assert reading.attention is not None
        blocks = [attention_distance(block, self.grid) for block in reading.attention]
        self.per_image.extend(np.stack(blocks, axis=1))  # (B, blocks, heads) split by image

    def finish(self, sources: list[ImageSource]) -> DistanceResult:
        per_image = np.stack(self.per_image)
        return DistanceResult(self.grid, per_image.mean(axis=0), per_image, sources, False, DISTANCE_NOTE)


class CkaAccumulator:
    """Minibatches of `minibatch` images; only their flattened rows wait here (one float64 buffer of a minibatch) until
    it is full."""

    def __init__(self, blocks: int, minibatch: int):
        if minibatch < CKA_MIN_IMAGES:
            raise ValueError(f"a CKA minibatch needs at least {CKA_MIN_IMAGES} images, not {minibatch}")
        self.minibatch = minibatch
        self.estimator = MinibatchCka(blocks)
        self.rows: Tensor | None = None  # (blocks, minibatch, N * D) float64: the minibatch being filled
        self.filled = 0  # images in it so far
        self.images = 0

    def add(self, reading: Reading) -> None:
        count = len(reading.residual[0])
        if self.rows is None:
            width = reading.residual[0][0].numel()
            self.rows = torch.empty(len(reading.residual), self.minibatch, width, dtype=torch.float64)
        self.images += count
        start = 0
        while start < count:
            taken = min(count - start, self.minibatch - self.filled)
            for block, residual in enumerate(reading.residual):  # copied once, converted to float64 on the way
                self.rows[block, self.filled : self.filled + taken] = residual[start : start + taken].flatten(1)
            self.filled += taken
            start += taken
            if self.filled == self.minibatch:
                self._flush()

    def _flush(self) -> None:
        # Every block's (m, m) Gram matrix X X^T in float64 (as `gram`), by one batched product on torch's threads.
        assert self.rows is not None
        rows = self.rows[:, : self.filled]
        self.estimator.add(list((rows @ rows.transpose(1, 2)).numpy()))
        self.filled = 0

    def finish(self) -> CkaResult:
        if self.filled >= CKA_MIN_IMAGES:
            self._flush()
        self.filled = 0
        if not self.estimator.minibatches:
            raise ValueError(f"CKA needs at least {CKA_MIN_IMAGES} images, not {self.images}")
        used, count = self.estimator.examples, self.estimator.minibatches
        return CkaResult(
            self.estimator.matrix(),
            f"minibatch unbiased HSIC (Nguyen et al. 2021): {count} minibatch(es) of up to {self.minibatch} images",
            CKA_EXAMPLE,
            self.images,
            used,
            self.minibatch,
            count,
        )


class PcaAccumulator:
    """The folder's principal components from streamed moments (no decomposition of every row at the end); the rows
    themselves are kept, as float32, because each image's RGB map needs the folder's components first."""

    def __init__(self, grid: PatchGrid, threshold: float):
        self.grid = grid
        self.threshold = threshold
        self.rows: list[np.ndarray] = []  # per batch: (B, patches, D) float32
        self.moments: Moments | None = None

    def add(self, reading: Reading) -> None:
        patches = reading.final[:, self.grid.num_prefix :]
        if self.moments is None:
            self.moments = Moments(patches.shape[-1])
        self.moments.add(patches.flatten(0, 1))
        self.rows.append(patches.numpy())

    def finish(self, sources: list[ImageSource]) -> PcaResult:
        assert self.moments is not None
        rows = np.concatenate(self.rows)  # (images, patches, D)
        images, patches, width = rows.shape
        principal = self.moments.principal_components(3)
        projected = (rows.reshape(-1, width) - principal.mean) @ principal.components.T  # (images x patches, k)
        scaled = min_max(projected, axis=0).reshape(images, self.grid.rows, self.grid.cols, -1)
        rgb = np.zeros((*scaled.shape[:3], 3))
        rgb[..., : scaled.shape[-1]] = scaled  # fewer than 3 components (width < 3) leave channels at 0
        first = rgb[..., 0]
        return PcaResult(
            self.grid,
            rgb,
            first,
            first > self.threshold,
            self.threshold,
            principal.components,
            principal.explained_variance_ratio,
            sources,
            PCA_FEATURES,
        )


class NormsAccumulator:
    def __init__(self, grid: PatchGrid, factor: float):
        self.grid = grid
        self.factor = factor
        self.norms: list[np.ndarray] = []  # per batch: (B, blocks, N)
        self.attention: list[np.ndarray] = []  # per batch: (B, blocks, N) the class token's row, mean over heads

    def add(self, reading: Reading) -> None:
        residual = torch.stack(reading.residual, dim=1)  # (B, blocks, N, D)
        self.norms.append(torch.linalg.vector_norm(residual.double(), dim=-1).float().numpy())
        if reading.attention is not None and self._has_class_token:
            class_rows = torch.stack([block[:, :, 0, :].double().mean(dim=1) for block in reading.attention], dim=1)
            self.attention.append(class_rows.numpy())

    @property
    def _has_class_token(self) -> bool:
        return self.grid.num_prefix > 0 and self.grid.prefix_names[0] == "CLS"

    def finish(self, sources: list[ImageSource]) -> NormsResult:
        norms = np.concatenate(self.norms)  # (images, blocks, N)
        attention = np.concatenate(self.attention) if self.attention else None
        medians = np.median(norms.transpose(1, 0, 2).reshape(norms.shape[1], -1), axis=1)
        outliers = [
            NormOutlier(
                int(image),
                int(token),
                self.grid.token_name(int(token)),
                int(block) + 1,
                float(norms[image, block, token]),
                float(medians[block]),
                None if attention is None else float(attention[image, block, token]),
            )
            for image, block, token in np.argwhere(norms > self.factor * medians[None, :, None])
        ]
        return NormsResult(self.grid, norms, medians, self.factor, outliers, sources, NORMS_NOTE)
