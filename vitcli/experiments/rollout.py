"""Attention rollout (Abnar and Zuidema 2020): how much of a token's final state flows from each input token.

It fuses the heads of every block, so a rollout row is never a single head's attention.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from vitcli.errors import UsageError
from vitcli.experiments.attention import Query, check_top_k, checked_traces
from vitcli.grid import PatchGrid
from vitcli.images import ImageSource
from vitcli.model import PreparedImage, VitModel

HEAD_FUSIONS = ("mean", "max", "min")


def check_rollout_options(head_fusion: str, discard_ratio: float) -> None:
    if head_fusion not in HEAD_FUSIONS:
        raise UsageError(f"--head-fusion must be one of {', '.join(HEAD_FUSIONS)}, not {head_fusion}")
    if not 0.0 <= discard_ratio < 1.0:
        raise UsageError(f"--discard-ratio must be at least 0 and below 1, not {discard_ratio:g}")


def attention_rollout(attention: Tensor, head_fusion: str = "mean", discard_ratio: float = 0.0) -> Tensor:
    """Attention rollout of (blocks, heads, N, N) attention given in block order.

    Per block: the heads are fused (mean, max or min); with a discard ratio r, the floor(r * N) smallest fused
    entries of each row are set to zero, the CLS column (token 0) excepted; the identity is added for the residual
    path and each row renormalized to sum 1. The result is the product A_L ... A_1, (N, N): row i is how much of
    token i's final representation flows, through attention and residuals, from each input token.
    """
    check_rollout_options(head_fusion, discard_ratio)
    attention = attention.double()
    tokens = attention.shape[-1]
    identity = torch.eye(tokens, dtype=torch.float64)
    discard = int(discard_ratio * tokens)
    rollout = identity
    for block in attention:
        fused = {"mean": block.mean(dim=0), "max": block.amax(dim=0), "min": block.amin(dim=0)}[head_fusion]
        if discard:
            candidates = fused.clone()
            candidates[:, 0] = math.inf
            fused = fused.scatter(-1, candidates.topk(discard, dim=-1, largest=False).indices, 0.0)
        step = fused + identity
        rollout = (step / step.sum(dim=-1, keepdim=True)) @ rollout
    return rollout


@dataclass
class Rollout:
    """The rollout row of one query in one image: not a single head's attention."""

    source: ImageSource
    crop: np.ndarray  # (H, W, 3) uint8: what the model saw, for the figure
    grid: PatchGrid
    query: Query
    head_fusion: str
    discard_ratio: float
    row: Tensor  # (N,) float64 rollout row of the query; sums to 1
    self_check: dict[int, float]  # one-based block -> largest |explicit - fused| attention output
    weights: str  # the model weights' label
    top_k: int = 10

    def top(self, count: int) -> list[tuple[int, float]]:
        """The `count` sources with the largest rollout, as (token, rollout), largest first."""
        best = self.row.topk(count)
        return list(zip(best.indices.tolist(), best.values.tolist(), strict=True))


def rollout(
    model: VitModel,
    images: Sequence[PreparedImage],
    query: Query,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    top_k: int = 10,
) -> list[Rollout]:
    """The rollout row of the query through every block, per image."""
    check_top_k(model.grid, top_k)
    check_rollout_options(head_fusion, discard_ratio)
    results = []
    for image in checked_traces(model, images, list(range(1, model.depth + 1))):
        stacked = torch.stack(list(image.attention.values()))
        results.append(
            Rollout(
                image.prepared.source,
                image.prepared.crop_uint8(),
                model.grid,
                query,
                head_fusion,
                discard_ratio,
                attention_rollout(stacked, head_fusion, discard_ratio)[query.token].clone(),
                image.self_check,
                model.spec.label,
                top_k,
            )
        )
    return results
