"""timm's Beit (BEiT, BEiT v2): a class token, a relative position bias added to every block's attention scores
(each block's own table, a shared one, or both), layer scale (gamma_1, gamma_2), average pooling over the patches
by default, then fc_norm and the classifier.

Its blocks must be timm's pre-norm beit `Block` with beit's `Attention`:
x + drop_path1(gamma_1 * attn(norm1(x), shared_rel_pos_bias)), then + drop_path2(gamma_2 * mlp(norm2(x))); the
attention runs softmax(q k^T * scale + relative bias) over every token.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F  # noqa: N812  (the usual name)
from timm.layers import PatchEmbed
from timm.models.beit import Attention, Beit, Block
from torch import Tensor, nn

from vitcli.capture.families.timm_vit import TimmFamily, heads_at_input, unfused
from vitcli.capture.family import BlockPlace, Tap
from vitcli.grid import PatchGrid

QKV_PART = {"attn.hook_q": 0, "attn.hook_k": 1, "attn.hook_v": 2}


def qkv_bias(attention: nn.Module) -> Tensor | None:
    """The bias BEiT-style attentions add to their bias-free qkv Linear: q_bias, a zero k_bias, v_bias (or none)."""
    if attention.q_bias is None:
        return None
    return torch.cat((attention.q_bias, attention.k_bias, attention.v_bias))


def projected_part(attention: nn.Module, part: int, heads: int, head_dim: int) -> Tap:
    """q (part 0), k (1) or v (2) per head, (batch, tokens, heads, d), read-only at the attention's input.

    BEiT-style attentions fold q_bias and v_bias into F.linear with the qkv weight, so the qkv module itself never
    runs; the site recomputes that one projection (the same F.linear on the same rows) from what the attention reads.
    """
    width = heads * head_dim
    rows = slice(part * width, (part + 1) * width)

    def to_site(normed: Tensor) -> Tensor:
        bias = qkv_bias(attention)
        projected = F.linear(normed, attention.qkv.weight[rows], None if bias is None else bias[rows])
        return projected.unflatten(-1, (heads, head_dim))

    return Tap(attention, "input", to_site, None)


def pooled_vector_sites(net: nn.Module) -> frozenset[str]:
    """The model sites of a timm net that ends norm -> pool -> fc_norm -> head (pool.hook_out only when it pools)."""
    sites = {"embed.hook_patches", "ln_final.hook_normalized", "head.hook_in"}
    if net.global_pool:
        sites.add("pool.hook_out")
    return frozenset(sites)


def pooled_vector_tap(net: nn.Module, kind: str) -> Tap:
    """Those model sites' taps: the final norm's rows, fc_norm's input (the pooled vector), the head's input."""
    return {
        "embed.hook_patches": lambda: Tap(net.patch_embed, "output"),
        "ln_final.hook_normalized": lambda: Tap(net.norm, "output"),
        "pool.hook_out": lambda: Tap(net.fc_norm, "input"),
        "head.hook_in": lambda: Tap(net.head, "input"),
    }[kind]()


class TimmBeit(TimmFamily):
    name = "timm Beit"

    net: Beit

    def __init__(self, net: nn.Module):
        super().__init__(net)
        self.model_sites = pooled_vector_sites(net)

    def refusal(self) -> str | None:
        for index, block in enumerate(self.net.blocks):
            if type(block) is not Block or type(getattr(block, "attn", None)) is not Attention:
                return (
                    f"block {index + 1} is a {type(block).__name__}; vitcli takes apart timm's pre-norm beit Block "
                    "and Attention"
                )
        return None

    @property
    def features(self) -> frozenset[str]:
        features = {"plain_rows"}
        if self.refusal() is None:
            features |= {"pattern", "heads", "replace"}
        if type(self.net.patch_embed) is PatchEmbed:
            features.add("linear_patches")
        if self.net.num_classes:
            features.add("class_head")
        features.add("cls_token")
        if self.net.pos_embed is not None:  # BEiT itself has none: its positions are the relative bias
            features.add("positions")
        if self.net.global_pool in ("token", "avg"):
            features.add("plain_pooling")
        return frozenset(features)

    def blocks(self) -> list[nn.Module]:
        return list(self.net.blocks)

    def places(self) -> list[BlockPlace]:
        grid = self.grid()
        return [
            BlockPlace(number, 1, grid, block.attn.num_heads, block.attn.proj.in_features // block.attn.num_heads)
            for number, block in enumerate(self.net.blocks, start=1)
        ]

    def grid(self) -> PatchGrid:
        embed = self.net.patch_embed
        height, width = embed.img_size
        return PatchGrid(height, width, embed.patch_size[0], ("CLS",))  # Beit always has its class token

    @property
    def pooling(self) -> str:
        return self.net.global_pool or "none"

    def embed(self, inputs: Tensor) -> Tensor:
        net = self.net
        rows = net.patch_embed(inputs)
        rows = torch.cat((net.cls_token.expand(rows.shape[0], -1, -1), rows), dim=1)
        if net.pos_embed is not None:
            rows = rows + net.pos_embed
        return net.pos_drop(rows)

    def run_from(self, number: int, rows: Tensor) -> Tensor:
        net = self.net
        shared = self._shared_bias()
        for block in net.blocks[number - 1 :]:
            rows = block(rows, shared_rel_pos_bias=shared)
        return net.forward_head(net.norm(rows))

    def _shared_bias(self) -> Tensor | None:
        """The relative position bias shared by every block, as forward_features computes it (None: each block has
        its own table only)."""
        return self.net.rel_pos_bias() if self.net.rel_pos_bias is not None else None

    def attention_from_heads(self, number: int, heads: Tensor) -> Tensor:
        return self.net.blocks[number - 1].attn.proj(heads.flatten(-2))

    def own_attention(self, number: int, normed: Tensor) -> Tensor:
        return self.net.blocks[number - 1].attn(normed, shared_rel_pos_bias=self._shared_bias())

    def block_tap(self, block: nn.Module, place: BlockPlace, kind: str) -> Tap:
        attention = block.attn
        taps: dict[str, Callable[[], Tap]] = {
            "hook_resid_pre": lambda: Tap(block, "input"),
            "ln1.hook_normalized": lambda: Tap(block.norm1, "output"),
            "ln2.hook_normalized": lambda: Tap(block.norm2, "output"),
            # The probabilities after the relative position bias (its own table and any shared one) joined the scores.
            "attn.hook_pattern": lambda: Tap(attention.attn_drop, "output", prepare=unfused(attention)),
            "attn.hook_z": lambda: heads_at_input(attention.proj, place.heads),
            # gamma_1 / gamma_2 (layer scale) are applied before drop path: its output is what the residual adds.
            "hook_attn_out": lambda: Tap(block.drop_path1, "output"),
            "hook_mlp_out": lambda: Tap(block.drop_path2, "output"),
            "hook_resid_post": lambda: Tap(block, "output"),
        }
        if kind in QKV_PART:
            return projected_part(attention, QKV_PART[kind], place.heads, place.head_dim)
        return taps[kind]()

    def model_tap(self, kind: str) -> Tap:
        return pooled_vector_tap(self.net, kind)
