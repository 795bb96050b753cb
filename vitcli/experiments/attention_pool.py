"""`attend --pool`: the attention pooling's attention over the final rows (timm's AttentionPoolLatent, the 'map'
head of SigLIP), per head, for the first latent query.

The probabilities come from the capture layer's pool.hook_pattern in the model's own forward. Before they leave this
module, they must equal softmax(q k^T * scale) written out from the pooling's q and kv weights, and that pattern @ v,
joined over heads and projected, must reproduce the output the pooling computes itself (its fused path), each within
SELF_CHECK_TOLERANCE; every row must sum to 1 within SUM_TOLERANCE.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from vitcli.capture import caching
from vitcli.capture.families.timm_vit import explicit_latent_attention, own_latent_attention
from vitcli.errors import VitcliError
from vitcli.experiments.attention import SELF_CHECK_TOLERANCE, SUM_TOLERANCE, check_top_k
from vitcli.grid import PatchGrid
from vitcli.images import ImageSource
from vitcli.model import PreparedImage, VitModel

POOL_CHECK = (
    "largest |captured pattern - softmax(q k^T * scale) from the pooling's weights| and "
    "|proj(pattern @ v) - the pooling's own attention output|"
)


@dataclass
class PoolRow:
    head: int  # one-based
    attention: Tensor  # (N,) over every final row, prefix tokens first; never renormalized

    @property
    def total(self) -> float:
        return float(self.attention.double().sum())

    def top(self, count: int) -> list[tuple[int, float]]:
        """The `count` rows with the most attention, as (token, attention), largest first."""
        best = self.attention.topk(count)
        return list(zip(best.indices.tolist(), best.values.tolist(), strict=True))


@dataclass
class PoolAttention:
    """Where the attention pooling's (first) latent query looks in one image, per head."""

    source: ImageSource
    crop: np.ndarray  # (H, W, 3) uint8: what the model saw, for the figure
    grid: PatchGrid
    latents: int  # the pooling's latent queries; the rows are the first one's
    maps: list[PoolRow]
    self_check: float  # the larger of the two checks in POOL_CHECK, for this image
    weights: str
    top_k: int = 10


def pool_attention(
    model: VitModel, images: Sequence[PreparedImage], heads: Sequence[int], top_k: int = 10
) -> list[PoolAttention]:
    """The attention pooling's probabilities over the final rows for the given one-based heads, per image."""
    pool = model.net.attn_pool
    grid = model.grid
    check_top_k(grid, top_k)
    results = []
    for start in range(0, len(images), model.batch_size):
        batch = images[start : start + model.batch_size]
        with torch.inference_mode():
            inputs = torch.stack([image.input for image in batch]).to(model.device)
            with caching(model.family, ["ln_final.hook_normalized", "pool.hook_pattern"]) as captured:
                model.net(inputs)
            rows = captured["ln_final.hook_normalized"]
            explicit, output = explicit_latent_attention(pool, rows)
            own = own_latent_attention(pool, rows)
        pattern = captured["pool.hook_pattern"]
        differences = torch.maximum(
            (pattern.double() - explicit.double()).abs().flatten(1).amax(dim=1),
            (output.double() - own.double()).abs().flatten(1).amax(dim=1),
        ).cpu()
        worst = float(differences.max())
        if not worst <= SELF_CHECK_TOLERANCE:
            raise VitcliError(
                f"self-check failed in the attention pooling: the captured attention differs from the one written "
                f"out from its weights, or from its own output, by {worst:.3g} (tolerance {SELF_CHECK_TOLERANCE:g}); "
                "no results printed"
            )
        sums = float((pattern.double().sum(dim=-1) - 1).abs().max())
        if not sums <= SUM_TOLERANCE:
            raise VitcliError(
                f"attention rows of the pooling sum to 1 only within {sums:.3g} (tolerance {SUM_TOLERANCE:g})"
            )
        pattern = pattern.float().cpu()
        for index, image in enumerate(batch):
            results.append(
                PoolAttention(
                    image.source,
                    image.crop_uint8(),
                    grid,
                    pattern.shape[2],
                    [PoolRow(head, pattern[index, head - 1, 0].clone()) for head in heads],
                    float(differences[index]),
                    model.spec.label,
                    top_k,
                )
            )
    return results
