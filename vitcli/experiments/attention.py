"""Exact attention: one query's row of softmax(q k^T * scale) per block and head, checked against the model.

Every row comes from `VitModel.trace` (the explicit forward) and is kept as computed, never renormalized. Before a
batch's rows leave this module, the explicit attention times v, joined over heads and projected, must reproduce the
attention module's own (fused) output within SELF_CHECK_TOLERANCE, and every row must sum to 1 within SUM_TOLERANCE.
The summary (`attention_summary`) and rollout (`rollout`) experiments read the same checked traces.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from vitcli.capture import block_site, caching, pattern_site, sublayer_site
from vitcli.errors import UsageError, VitcliError
from vitcli.grid import PatchGrid
from vitcli.images import ImageSource
from vitcli.model import PreparedImage, VitModel

SELF_CHECK_TOLERANCE = 1e-4  # largest |explicit - fused| attention-module output allowed, in the model's units
SUM_TOLERANCE = 1e-5  # largest |row sum - 1| allowed for a row of attention
# What the self-check compares: the explicit forward against the fused module, or (families without one) the
# captured pattern against the heads' outputs the module computed in the same forward.
EXPLICIT_CHECK = "largest |explicit attention @ v, heads joined and projected - the attention module's own output|"
CAPTURED_CHECK = "largest |captured attention @ v - every head's output as the attention module computed it|"


# ----- what the user asked for


@dataclass(frozen=True)
class Query:
    """The token whose row of attention is shown: a prefix token (CLS, ...) or a patch."""

    token: int
    name: str  # "CLS" or "P74"
    patch: int | None
    row: int | None  # zero-based grid row of the patch, None for a prefix token
    col: int | None


def token_query(grid: PatchGrid, token: int) -> Query:
    patch = grid.patch_of_token(token)
    row, col = grid.position(patch) if patch is not None else (None, None)
    return Query(token, grid.token_name(token), patch, row, col)


def parse_query(grid: PatchGrid, text: str) -> Query:
    """A query given as a patch (`74`, `P74`), a zero-based grid position (`r5c3`) or a prefix token name (`cls`)."""
    try:
        prefix = grid.prefix_token(text)
    except UsageError as error:
        raise UsageError(f"--query {text.strip()}: {error}") from error
    if prefix is not None:
        return token_query(grid, prefix)
    try:
        patch = grid.parse_patch(text.strip())
    except UsageError as error:
        if not grid.prefix_names:
            raise UsageError(f"--query {text}: {error} (this model has no class token)") from error
        names = ", ".join(name.lower() for name in grid.prefix_names)
        which = "the class token" if grid.num_prefix == 1 else "the prefix tokens"
        prefixes = f"; or {names} for {which}" if names else ""
        raise UsageError(f"--query {text}: {error}{prefixes}") from error
    return token_query(grid, grid.token_of_patch(patch))


def resolve_blocks(depth: int, block: int | None, every: bool) -> list[int]:
    """One-based block numbers to show: `block`, or all of them."""
    return _resolve_counted("block", "--view all-blocks", depth, block, every)


def resolve_heads(num_heads: int, head: int | None, every: bool) -> list[int]:
    """One-based head numbers to show: `head`, or all of them."""
    return _resolve_counted("head", "--all-heads", num_heads, head, every)


def _resolve_counted(what: str, every_option: str, count: int, chosen: int | None, every: bool) -> list[int]:
    if every and chosen is not None:
        raise UsageError(f"--{what} {chosen} and {every_option} contradict each other: give one")
    if every:
        return list(range(1, count + 1))
    if chosen is None:
        raise UsageError(f"choose a {what}: --{what} 1..{count}, or {every_option}")
    if not 1 <= chosen <= count:
        raise UsageError(f"--{what} must be between 1 and {count} (this model has {count} {what}s), not {chosen}")
    return [chosen]


def check_top_k(grid: PatchGrid, top_k: int) -> None:
    if not 1 <= top_k <= grid.num_tokens:
        raise UsageError(f"--top-k must be between 1 and {grid.num_tokens} (the model's tokens), not {top_k}")


# ----- the explicit forward, checked


@dataclass
class CheckedImage:
    """One image's explicit forward, restricted to the blocks asked for, after the self-check passed."""

    prepared: PreparedImage
    attention: dict[int, Tensor]  # one-based block -> (heads, N, N) softmax(q k^T * scale)
    self_check: dict[int, float]  # one-based block -> largest |explicit - fused| attention output in this image


def require_attention(model: VitModel) -> None:
    """Refuse, before any forward, a model whose attention neither the explicit forward (timm's ViT) nor the capture
    layer's attn.hook_pattern (the other families) can read."""
    features = model.family.features
    if "explicit_forward" not in features and "pattern" not in features:
        model.require_standard_blocks()  # names the block it cannot follow
        raise VitcliError(f"cannot capture attention in {model.name}: {model.family.refusal()}")


def checked_traces(model: VitModel, images: Sequence[PreparedImage], blocks: Sequence[int]) -> Iterator[CheckedImage]:
    """Trace the images batch_size at a time, keep the given one-based blocks, refuse any failing check.

    Both checks run once per batch and block: one call of the attention module over the whole batch (families
    without an explicit forward: one capture forward and one fused forward of the batch, `captured_attention`).
    """
    for start in range(0, len(images), model.batch_size):
        batch = images[start : start + model.batch_size]
        inputs = torch.stack([image.input for image in batch])
        if "explicit_forward" in model.family.features:
            trace = model.trace(inputs, keep=[block - 1 for block in blocks])
            attention = {block: trace.blocks[block - 1].attention for block in blocks}
            differences = {block: model.attention_self_check(trace.blocks[block - 1]) for block in blocks}
            compared = "the explicit attention differs from the module's own output"
        else:
            attention, differences = captured_attention(model, inputs, blocks)
            compared = "the captured attention differs from the heads' outputs or the fused forward"
        for block in blocks:
            worst = float(differences[block].max())
            if not worst <= SELF_CHECK_TOLERANCE:
                raise VitcliError(
                    f"self-check failed in block {block}: {compared} by {worst:.3g} "
                    f"(tolerance {SELF_CHECK_TOLERANCE:g}); no results printed"
                )
            sums = float((attention[block].double().sum(dim=-1) - 1).abs().max())
            if not sums <= SUM_TOLERANCE:
                raise VitcliError(
                    f"attention rows of block {block} sum to 1 only within {sums:.3g} (tolerance {SUM_TOLERANCE:g})"
                )
        for row, image in enumerate(batch):
            yield CheckedImage(
                image,
                {block: attention[block][row] for block in blocks},
                {block: float(differences[block][row]) for block in blocks},
            )


def captured_attention(
    model: VitModel, inputs: Tensor, blocks: Sequence[int]
) -> tuple[dict[int, Tensor], dict[int, Tensor]]:
    """For families vitcli does not write out by hand: per one-based block the (B, heads, N, N) probabilities at
    attn.hook_pattern (the family's non-fused path), and per image the larger of two checks: |pattern @ v - z| (every
    head's output as the module computed it in that forward) and |that forward's - the fused forward's| attention
    sublayer output (hook_attn_out)."""
    kinds = ("attn.hook_pattern", "attn.hook_v", "attn.hook_z", "hook_attn_out")
    outputs = [sublayer_site(block, "attn") for block in blocks]
    with torch.inference_mode():
        inputs = inputs.to(model.device)
        with caching(model.family, [block_site(block, kind) for block in blocks for kind in kinds]) as captured:
            model.net(inputs)
        with caching(model.family, outputs) as fused:  # no pattern hooked: the module's own fused path
            model.net(inputs)
    attention, differences = {}, {}
    for block, output in zip(blocks, outputs, strict=True):
        pattern, v, z = (captured[block_site(block, kind)].double() for kind in kinds[:3])
        heads = (torch.einsum("bhqk,bkhd->bqhd", pattern, v) - z).abs().flatten(1).amax(dim=1)
        fused_path = (captured[output].double() - fused[output].double()).abs().flatten(1).amax(dim=1)
        differences[block] = torch.maximum(heads, fused_path).cpu()
        attention[block] = captured[pattern_site(block)].float().cpu()
    return attention, differences


# ----- one query row per block and head


@dataclass
class AttentionRow:
    block: int  # one-based
    head: int  # one-based
    attention: Tensor  # (N,) over all sources, prefix tokens first; never renormalized

    @property
    def total(self) -> float:
        return float(self.attention.double().sum())

    def top(self, count: int) -> list[tuple[int, float]]:
        """The `count` sources with the most attention, as (token, attention), largest first."""
        best = self.attention.topk(count)
        return list(zip(best.indices.tolist(), best.values.tolist(), strict=True))


def patch_map(grid: PatchGrid, row: Tensor) -> np.ndarray:
    """The patch sources of a row over N tokens as a (rows, cols) array: entry [r, c] is patch r * cols + c + 1."""
    return row[grid.num_prefix :].reshape(grid.rows, grid.cols).numpy()


@dataclass
class QueryAttention:
    """Where one query's attention goes in one image, for one or more (block, head) pairs."""

    source: ImageSource
    crop: np.ndarray  # (H, W, 3) uint8: what the model saw, for the figure
    grid: PatchGrid
    query: Query
    maps: list[AttentionRow]
    self_check: dict[int, float]  # one-based block -> largest |explicit - fused| attention output
    weights: str  # the model weights' label, e.g. "RANDOM (seed 0)"
    top_k: int = 10
    stage: int | None = None  # the blocks' stage in a model of stages with their own grids (Swin), else None
    self_check_what: str = EXPLICIT_CHECK


def attend(
    model: VitModel,
    images: Sequence[PreparedImage],
    query: Query,
    blocks: Sequence[int],
    heads: Sequence[int],
    top_k: int = 10,
) -> list[QueryAttention]:
    """The query's row of attention in each given (block, head), per image; blocks and heads one-based. The blocks
    share one grid: the model's, or their stage's (Swin)."""
    places = model.family.places()
    (grid,) = {places[block - 1].grid for block in blocks}
    stages = {place.stage for place in places}
    check_top_k(grid, top_k)
    return [
        QueryAttention(
            image.prepared.source,
            image.prepared.crop_uint8(),
            grid,
            query,
            [
                AttentionRow(block, head, image.attention[block][head - 1, query.token].clone())
                for block in blocks
                for head in heads
            ],
            image.self_check,
            model.spec.label,
            top_k,
            places[blocks[0] - 1].stage if len(stages) > 1 else None,
            EXPLICIT_CHECK if "explicit_forward" in model.family.features else CAPTURED_CHECK,
        )
        for image in checked_traces(model, images, blocks)
    ]
