"""timm's Eva (EVA, EVA-02 and the other ViTs timm builds with it): a class token and registers, rotary position
embedding (RoPE) on the patches' q and k, a SwiGLU MLP, an optional sub-norm inside the attention
(scale_attn_inner), layer scale (gamma_1, gamma_2), average, token or attention ('map') pooling.

Its blocks must be timm's pre-norm `EvaBlock` with `EvaAttention` and no gate:
x + drop_path1(gamma_1 * attn(norm1(x), rope)), then + drop_path2(gamma_2 * mlp(norm2(x))); the attention runs
softmax(q k^T * scale) over every token, q and k rotated by the rope the model hands each block (prefix tokens are
not rotated), then its sub-norm (an Identity unless scale_attn_inner) and the output projection.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from timm.layers import PatchEmbed, apply_rot_embed_cat
from timm.models.eva import Eva, EvaAttention, EvaBlock
from torch import Tensor, nn

from vitcli.capture.families.timm_beit import QKV_PART, pooled_vector_sites, pooled_vector_tap, projected_part
from vitcli.capture.families.timm_vit import (
    TimmFamily,
    heads_at_input,
    latent_pattern,
    unfused,
    v_of_qkv,
)
from vitcli.capture.family import BlockPlace, Tap
from vitcli.grid import PatchGrid


def rotated_q_or_k(attention: nn.Module, norm: nn.Module) -> Tap:
    """q or k per head after RoPE, read-only at `norm`'s output (q_norm or k_norm): the rope the block handed its
    attention (kept by a hook on the attention's call) applied to the patch rows as EvaAttention applies it."""
    rope: list[Tensor | None] = [None]

    def prepare() -> Callable[[], None]:
        def keep(_module: nn.Module, _args: tuple, kwargs: dict) -> None:
            rope[0] = kwargs.get("rope")

        return attention.register_forward_pre_hook(keep, with_kwargs=True).remove

    def to_site(heads_first: Tensor) -> Tensor:  # (batch, heads, tokens, d) as timm holds it
        if rope[0] is not None:
            prefix = attention.num_prefix_tokens
            patches = apply_rot_embed_cat(heads_first[:, :, prefix:, :], rope[0], half=attention.rotate_half)
            heads_first = torch.cat([heads_first[:, :, :prefix, :], patches], dim=2)
        return heads_first.transpose(1, 2)

    return Tap(norm, "output", to_site, None, prepare=prepare)


class TimmEva(TimmFamily):
    name = "timm Eva"

    net: Eva

    def __init__(self, net: nn.Module):
        super().__init__(net)
        self.model_sites = pooled_vector_sites(net)
        if net.attn_pool is not None:
            self.model_sites = self.model_sites | {"pool.hook_pattern"}

    def refusal(self) -> str | None:
        for index, block in enumerate(self.net.blocks):
            attention = getattr(block, "attn", None)
            if type(block) is not EvaBlock or type(attention) is not EvaAttention:
                return (
                    f"block {index + 1} is a {type(block).__name__} with {type(attention).__name__}; vitcli takes "
                    "apart timm's pre-norm EvaBlock and EvaAttention"
                )
            if attention.gate is not None:
                return f"block {index + 1} gates its attention output"
        return None

    @property
    def features(self) -> frozenset[str]:
        features = {"plain_rows"}
        if self.refusal() is None:
            features |= {"pattern", "replace"}
            # A sub-norm between the heads and the projection mixes the heads: no per-head linear decomposition.
            if all(isinstance(block.attn.norm, nn.Identity) for block in self.net.blocks):
                features.add("heads")
        if type(self.net.patch_embed) is PatchEmbed:
            features.add("linear_patches")
        if self.net.num_classes:
            features.add("class_head")
        if self.net.cls_token is not None:
            features.add("cls_token")
        if self.net.pos_embed is not None:  # EVA-02 adds them besides RoPE
            features.add("positions")
        if self.net.attn_pool is None and self.net.global_pool in ("token", "avg"):
            features.add("plain_pooling")
        return frozenset(features)

    def blocks(self) -> list[nn.Module]:
        return list(self.net.blocks)

    def places(self) -> list[BlockPlace]:
        grid = self.grid()
        return [
            BlockPlace(number, 1, grid, block.attn.num_heads, block.attn.head_dim)
            for number, block in enumerate(self.net.blocks, start=1)
        ]

    def grid(self) -> PatchGrid:
        net = self.net
        height, width = net.patch_embed.img_size
        names = ["CLS"] if net.cls_token is not None else []
        registers = 0 if net.reg_token is None else net.reg_token.shape[1]
        names.extend(f"R{index + 1}" for index in range(registers))
        return PatchGrid(height, width, net.patch_embed.patch_size[0], tuple(names))

    @property
    def pooling(self) -> str:
        return "map" if self.net.attn_pool is not None else (self.net.global_pool or "none")

    def embed(self, inputs: Tensor) -> Tensor:
        net = self.net
        rows, _rope = net._pos_embed(net.patch_embed(inputs))
        return net.norm_pre(rows)

    def run_from(self, number: int, rows: Tensor) -> Tensor:
        net = self.net
        for index in range(number - 1, len(net.blocks)):
            rows = net.blocks[index](rows, rope=self._rope(index + 1))
        return net.forward_head(net.norm(rows))

    def _rope(self, number: int) -> Tensor | None:
        """The rotary embedding forward_features hands block `number` (an eval forward at the model's own grid)."""
        net = self.net
        if net.rope is None:
            return None
        if hasattr(net.rope, "feat_shape") and not net.dynamic_img_size:
            rope = net.rope.get_embed()
        else:
            rope = net.rope.get_embed(shape=net.patch_embed.grid_size)
        return rope[number - 1] if net.rope_mixed else rope

    def attention_from_heads(self, number: int, heads: Tensor) -> Tensor:
        attention = self.net.blocks[number - 1].attn
        return attention.proj(attention.norm(heads.flatten(-2)))

    def own_attention(self, number: int, normed: Tensor) -> Tensor:
        return self.net.blocks[number - 1].attn(normed, rope=self._rope(number))

    def block_tap(self, block: nn.Module, place: BlockPlace, kind: str) -> Tap:
        attention = block.attn
        taps: dict[str, Callable[[], Tap]] = {
            "hook_resid_pre": lambda: Tap(block, "input"),
            "ln1.hook_normalized": lambda: Tap(block.norm1, "output"),
            "ln2.hook_normalized": lambda: Tap(block.norm2, "output"),
            "attn.hook_q": lambda: rotated_q_or_k(attention, attention.q_norm),
            "attn.hook_k": lambda: rotated_q_or_k(attention, attention.k_norm),
            "attn.hook_v": lambda: self._v_tap(attention, place),
            # The probabilities of softmax(q k^T * scale) with q and k rotated: the non-fused path's attn_drop.
            "attn.hook_pattern": lambda: Tap(attention.attn_drop, "output", prepare=unfused(attention)),
            # pattern @ v per head, before the sub-norm (an Identity unless scale_attn_inner) and the projection.
            "attn.hook_z": lambda: heads_at_input(attention.norm, place.heads),
            # gamma_1 / gamma_2 (layer scale) are applied before drop path: its output is what the residual adds.
            "hook_attn_out": lambda: Tap(block.drop_path1, "output"),
            "hook_mlp_out": lambda: Tap(block.drop_path2, "output"),
            "hook_resid_post": lambda: Tap(block, "output"),
        }
        return taps[kind]()

    @staticmethod
    def _v_tap(attention: nn.Module, place: BlockPlace) -> Tap:
        """v per head: replaceable where a module computes it (v_proj, or a bias-free fused qkv); read-only where
        the attention folds q_bias and v_bias into F.linear with the qkv weight (EVA-02's default)."""
        if attention.v_proj is not None:
            return Tap(
                attention.v_proj,
                "output",
                lambda t: t.unflatten(-1, (place.heads, place.head_dim)),
                lambda _original, site: site.flatten(-2),
            )
        if attention.q_bias is None:
            return v_of_qkv(attention.qkv, place.heads, place.head_dim)
        return projected_part(attention, QKV_PART["attn.hook_v"], place.heads, place.head_dim)

    def model_tap(self, kind: str) -> Tap:
        net = self.net
        if kind == "pool.hook_pattern":
            return latent_pattern(net.attn_pool)
        return pooled_vector_tap(net, kind)
