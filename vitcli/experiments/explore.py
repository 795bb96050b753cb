"""Everything the attention explorer page shows: every query's attention row in the chosen blocks and heads, and the
rollout of every query, for one image.

The rows come from the same checked explicit forward as `vitcli attend` (`checked_traces`): the page's numbers are
`attend`'s numbers, stored as float16. The page has a size bound (PAGE_VALUE_BOUND attention values); a model above
it needs `--blocks`, refused before any weights load.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from vitcli.errors import UsageError
from vitcli.experiments.attention import checked_traces
from vitcli.experiments.rollout import attention_rollout
from vitcli.grid import PatchGrid
from vitcli.images import ImageSource
from vitcli.model import PreparedImage, VitModel
from vitcli.spec import ascii_number

# 2 bytes each as float16, 8/3 characters in base64: at most about 5.3 MB of attention data, so that a page with
# its photo and script stays under 8 MB. ViT-Tiny (12 blocks x 3 heads x 197 x 197, plus the rollout) holds 1.44 M.
PAGE_VALUE_BOUND = 2_000_000
# float16 keeps 11 significant bits: a stored value is within 2^-11 of the exact one, relative (rounding to nearest),
# or within 2^-25 absolute below float16's normal range (2^-14).
FLOAT16_RELATIVE = 2.0**-11
FLOAT16_ABSOLUTE = 2.0**-25
PRECISION = (
    "float16: each stored weight is within 2^-11 (0.049%) of the exact float32 attention, relative, or 2^-25 "
    "absolute below 2^-14"
)


def parse_blocks(text: str | None, depth: int) -> list[int]:
    """One-based blocks from `4`, `1-4`, `1,6,12` or `all` (None: all), in order, without repeats."""
    if text is None or text.strip().lower() == "all":
        return list(range(1, depth + 1))
    chosen: list[int] = []
    for part in text.split(","):
        bounds = [ascii_number(bound) for bound in part.strip().split("-")]
        if not 1 <= len(bounds) <= 2 or None in bounds:
            raise UsageError(f"--blocks {text}: write blocks as 4, 1-4, 1,6,12 or all (blocks 1..{depth})")
        first, last = bounds[0], bounds[-1]
        if not 1 <= first <= last <= depth:
            raise UsageError(f"--blocks {text}: blocks run from 1 to {depth} (this model has {depth}), first to last")
        chosen.extend(range(first, last + 1))
    return sorted(set(chosen))


def page_values(blocks: int, heads: int, tokens: int) -> int:
    """The attention values a page holds: every row of every chosen block and head, and the rollout matrix."""
    return (blocks * heads + 1) * tokens * tokens


def check_page_bound(model_name: str, depth: int, heads: int, grid: PatchGrid, blocks: list[int], given: bool) -> None:
    """Refuse a page above PAGE_VALUE_BOUND, saying which --blocks would fit."""
    tokens = grid.num_tokens
    values = page_values(len(blocks), heads, tokens)
    if values <= PAGE_VALUE_BOUND:
        return
    fitting = max(0, (PAGE_VALUE_BOUND // (tokens * tokens) - 1) // heads)
    what = f"{len(blocks)} blocks x {heads} heads x {tokens}x{tokens} attention ({values:,} values with the rollout)"
    where = f"--blocks {', '.join(map(str, blocks))}" if given else model_name
    if fitting == 0:
        raise UsageError(
            f"explore: one block of {model_name} alone holds {heads * tokens * tokens:,} attention values, above the "
            f"page's bound of {PAGE_VALUE_BOUND:,}: use `vitcli attend` for this model"
        )
    raise UsageError(
        f"explore: {where} has {what}, above the page's bound of {PAGE_VALUE_BOUND:,}: pass --blocks with at most "
        f"{fitting} blocks, e.g. --blocks 1-{fitting} or --blocks {depth}"
    )


@dataclass
class Exploration:
    """Every query's attention in the chosen blocks and heads of one image, and every query's rollout."""

    source: ImageSource
    crop: np.ndarray  # (H, W, 3) uint8: what the model saw
    grid: PatchGrid
    model: str
    blocks: list[int]  # one-based, in order
    heads: int
    attention: Tensor  # (blocks, heads, N, N) float32 softmax(q k^T * scale), exactly as `attend` computes it
    rollout: Tensor  # (N, N) float64 rollout through every block, heads averaged, nothing discarded
    self_check: dict[int, float]  # one-based block -> largest |explicit - fused| attention output (every block)
    weights: str  # the model weights' label
    explanation: Any = None  # experiments.explain.Explanation: explain's maps, when asked for

    def stored_error(self) -> dict[str, float]:
        """The largest |float16 - exact| of the stored attention and rollout, as measured."""
        attention, rollout = self.attention.numpy(), self.rollout.numpy()
        return {
            "attention": float(np.abs(attention.astype(np.float16).astype(np.float32) - attention).max()),
            "rollout": float(np.abs(rollout.astype(np.float16).astype(np.float64) - rollout).max()),
        }


def explore(model: VitModel, images: Sequence[PreparedImage], blocks: Sequence[int]) -> list[Exploration]:
    """Per image: the chosen blocks' attention (one-based) and the rollout through all blocks."""
    every = list(range(1, model.depth + 1))
    results = []
    for image in checked_traces(model, images, every):
        stacked = torch.stack([image.attention[block] for block in every])
        results.append(
            Exploration(
                image.prepared.source,
                image.prepared.crop_uint8(),
                model.grid,
                model.name,
                list(blocks),
                model.num_heads,
                torch.stack([image.attention[block] for block in blocks]).float().contiguous(),
                attention_rollout(stacked, "mean", 0.0),
                image.self_check,
                model.spec.label,
            )
        )
    return results
