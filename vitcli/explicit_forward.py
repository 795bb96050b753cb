"""The explicit forward: a timm ViT's forward recomputed by hand, so that every intermediate row can be shown.

Channel-major patch flattening times W_E, the prefix tokens and position embeddings, then each block's attention as
its family adapter writes it out (softmax(q k^T * scale) per head) and its MLP. `VitModel.trace` and
`VitModel.flatten_patches` run it; `VitModel.logits` runs the model's own (fused) forward, and the capture layer's
self-check and the tests hold the two to agree.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor

if TYPE_CHECKING:
    from vitcli.model import VitModel


@dataclass
class BlockTrace:
    """What one block computed in the explicit forward; tensors are (batch, ...) on the CPU."""

    index: int  # zero-based: blocks[index]
    input: Tensor  # (B, N, D) rows entering the block
    normed: Tensor  # (B, N, D) norm1 of the input: what the attention reads
    q: Tensor  # (B, heads, N, head_dim)
    k: Tensor
    v: Tensor
    attention: Tensor  # (B, heads, N, N): softmax(q k^T * scale), rows sum to 1
    attention_output: Tensor  # (B, N, D): attention @ v, heads joined, projected
    output: Tensor  # (B, N, D) rows leaving the block


@dataclass
class Trace:
    patch_pixels: Tensor  # (B, patches, 3 p^2): each patch flattened channel-major
    patch_embeddings: Tensor  # (B, patches, D): patch_pixels @ W_E + b_E
    tokens: Tensor  # (B, N, D): prefix tokens joined and position embeddings added: block 1's input
    blocks: dict[int, BlockTrace] = field(default_factory=dict)  # keyed by zero-based block index
    logits: Tensor | None = None  # (B, classes): only when the trace ran the whole forward


def flatten_patches(inputs: Tensor, size: int) -> Tensor:
    """(B, 3, H, W) -> (B, patches, 3 p^2) for patches of `size` pixels, each channel-major: all R rows, then G,
    then B."""
    batch, channels, height, width = inputs.shape
    rows, cols = height // size, width // size
    blocks = inputs.reshape(batch, channels, rows, size, cols, size)
    return blocks.permute(0, 2, 4, 1, 3, 5).reshape(batch, rows * cols, channels * size * size)


def trace(model: VitModel, inputs: Tensor, keep: Collection[int] = (), logits: bool = False) -> Trace:
    """The explicit forward over (B, 3, H, W) inputs, keeping every intermediate of the zero-based blocks in `keep`.

    It stops after the last kept block (with nothing kept, after the embedding); logits=True runs every block and
    the head as well and fills Trace.logits.
    """
    kept = set(keep)
    if not kept <= set(range(model.depth)):
        raise ValueError(f"blocks to keep must be zero-based indexes below {model.depth}, not {sorted(kept)}")
    stop = model.depth if logits else max(kept, default=-1) + 1
    if stop:
        model.require_standard_blocks()
    net = model.net
    with torch.inference_mode():
        x = inputs.to(model.device)
        pixels = model.flatten_patches(x)
        weight, bias = model.patch_projection
        embeddings = pixels @ weight + bias
        if isinstance(net, VisionTransformer):
            rows = net.patch_embed.norm(embeddings)
            if net.dynamic_img_size:
                rows = rows.reshape(x.shape[0], model.grid.rows, model.grid.cols, -1)
            tokens = net.norm_pre(net.patch_drop(net._pos_embed(rows)))
        else:  # other families stop at block 1's input (their blocks are refused above): their own embedding
            tokens = model.family.embed(x)
        traced = Trace(pixels.cpu(), embeddings.cpu(), tokens.cpu())
        hidden = tokens
        for index, block in enumerate(net.blocks[:stop]):
            normed = block.norm1(hidden)
            q, k, v, attention, attention_output = model.family.explicit_attention(index + 1, normed)
            after_attention = hidden + block.drop_path1(block.ls1(attention_output))
            output = after_attention + block.drop_path2(block.ls2(block.mlp(block.norm2(after_attention))))
            if index in kept:
                traced.blocks[index] = BlockTrace(
                    index, *(t.cpu() for t in (hidden, normed, q, k, v, attention, attention_output, output))
                )
            hidden = output
        if logits:
            traced.logits = net.forward_head(net.norm(hidden)).float().cpu()
    return traced
