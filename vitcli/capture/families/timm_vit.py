"""timm's VisionTransformer in all its forms: a class token or none (SigLIP), registers (DINOv2 with registers),
a distillation token (DeiT), pooling by token, mean or attention ('map'), norm_pre (CLIP), layer scale, q/k norm,
any image and patch size.

Its blocks must be timm's pre-norm `Block` with the standard `Attention`: x + drop_path1(ls1(attn(norm1(x)))),
then + drop_path2(ls2(mlp(norm2(x)))); the attention runs softmax(q k^T * scale) over every token.
"""

from __future__ import annotations

from collections.abc import Callable

import timm
import torch
from timm.layers import Attention, Mlp, PatchEmbed
from timm.models.vision_transformer import Block, VisionTransformer
from torch import Tensor, nn

from vitcli.capture.checks import attention_output
from vitcli.capture.family import BlockPlace, Family, Tap
from vitcli.grid import PatchGrid

ALL_BLOCK_SITES = frozenset(
    (
        "hook_resid_pre",
        "ln1.hook_normalized",
        "attn.hook_q",
        "attn.hook_k",
        "attn.hook_v",
        "attn.hook_pattern",
        "attn.hook_z",
        "hook_attn_out",
        "hook_mlp_out",
        "hook_resid_post",
    )
)


# What the sites need of every block: the pre-norm layout's modules by their timm names.
REQUIRED_MODULES = ("norm1", "attn", "attn.qkv", "attn.proj", "ls1", "drop_path1", "norm2", "mlp", "ls2", "drop_path2")


def _module(root: nn.Module, path: str) -> nn.Module | None:
    for part in path.split("."):
        root = getattr(root, part, None)
        if not isinstance(root, nn.Module):
            return None
    return root


def unfused(attention: nn.Module) -> Callable[[], Callable[[], None]]:
    """A Tap's preparation: timm's explicit softmax path (the only one that calls attn_drop) while hooked; the logits
    move by at most 1e-6 against the fused path (../shared/NOTES.md)."""

    def prepare() -> Callable[[], None]:
        was_fused = attention.fused_attn
        attention.fused_attn = False

        def undo() -> None:
            attention.fused_attn = was_fused

        return undo

    return prepare


def per_head_q_or_k(module: nn.Module) -> Tap:
    """q or k at the output of timm's q_norm/k_norm, (batch, heads, tokens, d) in timm, (batch, tokens, heads, d) as a
    site."""
    return Tap(module, "output", lambda t: t.transpose(1, 2), lambda _original, site: site.transpose(1, 2))


def v_of_qkv(qkv: nn.Module, heads: int, head_dim: int) -> Tap:
    """v from one fused qkv Linear's output (q rows, then k rows, then v rows), (batch, tokens, heads, d)."""

    def to_site(output: Tensor) -> Tensor:
        return output.unflatten(-1, (3, heads, head_dim))[..., 2, :, :]

    def to_module(original: Tensor, site: Tensor) -> Tensor:
        parts = original.unflatten(-1, (3, heads, head_dim))
        return torch.stack((parts[..., 0, :, :], parts[..., 1, :, :], site), dim=-3).flatten(-3)

    return Tap(qkv, "output", to_site, to_module)


def heads_at_input(module: nn.Module, heads: int) -> Tap:
    """A module's (batch, tokens, heads x d) input split by head: attn.hook_z."""
    return Tap(module, "input", lambda t: t.unflatten(-1, (heads, -1)), lambda _original, site: site.flatten(-2))


class TimmFamily(Family):
    """What every timm family shares: the width of block 1's rows, the classifier's classes, and timm's pooled
    embedding (forward_head of forward_features with pre_logits=True)."""

    block_sites = ALL_BLOCK_SITES | {"ln2.hook_normalized"}

    @property
    def width(self) -> int:
        return self.net.embed_dim

    @property
    def num_classes(self) -> int:
        return self.net.num_classes

    def pooled(self, inputs: Tensor) -> Tensor:
        return self.net.forward_head(self.net.forward_features(inputs), pre_logits=True)


class TimmViT(TimmFamily):
    name = "timm VisionTransformer"
    model_sites = frozenset(("embed.hook_patches", "ln_final.hook_normalized", "pool.hook_out", "head.hook_in"))

    net: VisionTransformer

    def __init__(self, net: nn.Module):
        super().__init__(net)
        if getattr(net, "attn_pool", None) is not None:
            self.model_sites = self.model_sites | {"pool.hook_pattern"}
        if getattr(net, "head_dist", None) is not None:
            # DeiT's distilled head averages two heads' logits and never calls fc_norm: no pooled vector to hook.
            self.model_sites = self.model_sites - {"pool.hook_out"}

    def refusal(self) -> str | None:
        for index, block in enumerate(self.net.blocks):
            missing = [path for path in REQUIRED_MODULES if _module(block, path) is None]
            if missing:
                return f"block {index + 1} ({type(block).__name__}) has no {', '.join(missing)}"
            attention = getattr(block, "attn", None)
            if type(block) is not Block or type(attention) is not Attention or attention.gate is not None:
                return (
                    f"block {index + 1} is a {type(block).__name__} with {type(attention).__name__}; vitcli takes "
                    "apart timm's pre-norm Block and Attention"
                )
        return None

    @property
    def features(self) -> frozenset[str]:
        standard = self.refusal() is None
        features = {"plain_rows"}
        if standard:
            features |= {"pattern", "heads", "replace"}
        # trace writes out VisionTransformer's own forward: a subclass (DeiT's distilled one) or another MLP differs.
        if (
            standard
            and type(self.net) is VisionTransformer
            and all(type(block.mlp) is Mlp for block in self.net.blocks)
        ):
            features.add("explicit_forward")
        if type(self.net.patch_embed) is PatchEmbed:
            features.add("linear_patches")
        if all(
            type(block) is Block and type(block.attn) is Attention and type(block.mlp) is Mlp
            for block in self.net.blocks
        ):
            features.add("timm_blocks")  # what patch_size_variants.require_countable asks of compare-patch-size
        if self.net.num_classes:
            features.add("class_head")
        if self.net.pos_embed is not None:
            features.add("positions")
        return frozenset(features)

    def blocks(self) -> list[nn.Module]:
        return list(self.net.blocks)

    def places(self) -> list[BlockPlace]:
        grid = self.grid()
        # The module that has the heads: `attn`, or the attentions inside a block refusal() names (parallel blocks).
        attentions = [next(part for part in block.modules() if hasattr(part, "num_heads")) for block in self.net.blocks]
        return [
            BlockPlace(number, 1, grid, attention.num_heads, attention.head_dim)
            for number, attention in enumerate(attentions, start=1)
        ]

    def grid(self) -> PatchGrid:
        net = self.net
        height, width = net.patch_embed.img_size or timm.data.resolve_data_config(model=net)["input_size"][1:]
        return PatchGrid(height, width, net.patch_embed.patch_size[0], self.prefix_names())

    def prefix_names(self) -> tuple[str, ...]:
        net = self.net
        names = ["CLS"] if net.cls_token is not None else []
        if getattr(net, "dist_token", None) is not None:
            names.append("DIST")
        names.extend(f"R{index + 1}" for index in range(net.num_reg_tokens))  # registers R1..Rn
        if len(names) != net.num_prefix_tokens:
            raise ValueError(f"cannot name the {net.num_prefix_tokens} prefix tokens of {type(net).__name__}")
        return tuple(names)

    @property
    def pooling(self) -> str:
        return "map" if self.net.attn_pool is not None else self.net.global_pool

    def run_from(self, number: int, rows: Tensor) -> Tensor:
        net = self.net
        return net.forward_head(net.norm(net.blocks[number - 1 :](rows)))

    def block_tap(self, block: nn.Module, place: BlockPlace, kind: str) -> Tap:
        attention = block.attn
        taps: dict[str, Callable[[], Tap]] = {
            "hook_resid_pre": lambda: Tap(block, "input"),
            "ln1.hook_normalized": lambda: Tap(block.norm1, "output"),
            "ln2.hook_normalized": lambda: Tap(block.norm2, "output"),
            "attn.hook_q": lambda: per_head_q_or_k(attention.q_norm),
            "attn.hook_k": lambda: per_head_q_or_k(attention.k_norm),
            "attn.hook_v": lambda: v_of_qkv(attention.qkv, place.heads, place.head_dim),
            "attn.hook_pattern": lambda: Tap(attention.attn_drop, "output", prepare=unfused(attention)),
            # Before the attention's own sub-norm (an Identity unless scale_attn_norm): each head's output.
            "attn.hook_z": lambda: heads_at_input(attention.norm, place.heads),
            "hook_attn_out": lambda: Tap(block.drop_path1, "output"),
            "hook_mlp_out": lambda: Tap(block.drop_path2, "output"),
            "hook_resid_post": lambda: Tap(block, "output"),
        }
        return taps[kind]()

    def attention_from_heads(self, number: int, heads: Tensor) -> Tensor:
        attention = self.net.blocks[number - 1].attn
        return attention.proj(attention.norm(heads.flatten(-2)))

    def explicit_attention(self, number: int, normed: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        module = self.net.blocks[number - 1].attn
        batch, tokens, _ = normed.shape
        qkv = module.qkv(normed).reshape(batch, tokens, 3, module.num_heads, module.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        q, k = module.q_norm(q), module.k_norm(k)
        pattern = ((q @ k.transpose(-2, -1)) * module.scale).softmax(dim=-1)
        return q, k, v, pattern, attention_output(self, number, pattern, v.transpose(1, 2))

    def own_attention(self, number: int, normed: Tensor) -> Tensor:
        return self.net.blocks[number - 1].attn(normed)

    def model_tap(self, kind: str) -> Tap:
        net = self.net
        if kind == "pool.hook_pattern":
            return latent_pattern(net.attn_pool)
        return {
            "embed.hook_patches": lambda: Tap(net.patch_embed, "output"),
            "ln_final.hook_normalized": lambda: Tap(net.norm, "output"),
            "pool.hook_out": lambda: Tap(net.fc_norm, "input"),
            "head.hook_in": lambda: Tap(net.head, "input"),
        }[kind]()


def latent_pattern(pool: nn.Module) -> Tap:
    """An AttentionPoolLatent's probabilities (batch, heads, latents, tokens), read-only: softmax(q k^T * scale) of
    the latent queries (kept from q_norm, which runs first) and the keys at k_norm's output."""
    queries: list[Tensor] = []

    def prepare() -> Callable[[], None]:
        handle = pool.q_norm.register_forward_hook(lambda _module, _inputs, output: queries.append(output))
        return handle.remove

    def to_site(keys: Tensor) -> Tensor:
        return ((queries.pop() * pool.scale) @ keys.transpose(-2, -1)).softmax(dim=-1)

    return Tap(pool.k_norm, "output", to_site, None, prepare=prepare)


def explicit_latent_attention(pool: nn.Module, rows: Tensor) -> tuple[Tensor, Tensor]:
    """An AttentionPoolLatent's attention written out from its weights, for the rows it reads (B, N, D): the
    probabilities softmax(q k^T * scale) (B, heads, latents, N) and the attention output proj(pattern @ v), joined
    over heads (B, latents, D), before its MLP."""
    if pool.pos_embed is not None:
        rows = rows + pool.pos_embed.unsqueeze(0).to(rows.dtype)
    batch, tokens, _ = rows.shape
    q = pool.q(pool.latent.expand(batch, -1, -1)).unflatten(-1, (pool.num_heads, pool.head_dim)).transpose(1, 2)
    k, v = pool.kv(rows).reshape(batch, tokens, 2, pool.num_heads, pool.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    pattern = ((pool.q_norm(q) * pool.scale) @ pool.k_norm(k).transpose(-2, -1)).softmax(dim=-1)
    return pattern, pool.proj((pattern @ v).transpose(1, 2).flatten(-2))


def own_latent_attention(pool: nn.Module, rows: Tensor) -> Tensor:
    """The attention output (B, latents, D) an AttentionPoolLatent computes itself (its fused path) for `rows`:
    its output projection's output, read during the module's own forward."""
    outputs: list[Tensor] = []
    handle = pool.proj.register_forward_hook(lambda _module, _inputs, output: outputs.append(output))
    try:
        pool(rows)
    finally:
        handle.remove()
    return outputs[0]
