"""open_clip's own image tower (`open_clip.transformer.VisionTransformer` with `ResidualAttentionBlock`s): a pre-norm
ViT whose attention is torch's `nn.MultiheadAttention`, and whose output is the image embedding (`encode_image`).

`nn.MultiheadAttention` computes q, k, v, the probabilities and the heads' outputs inside one functional call, with
no module to hook between them (with `need_weights` it would return the probabilities averaged over heads). So q, k,
v and the pattern are computed here from the attention's input (the ln_1 output) and its `in_proj` weights:
q = x W_q^T + b_q per head, softmax(q k^T / sqrt(d)); they are read-only. attn.hook_z, the heads' outputs, is
computed the same way (pattern @ v) and can be replaced: the attention's output is then `out_proj(z)`. Tests hold
the computed values to the module's own output (1e-5).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812  (the usual name)
from torch import Tensor, nn

from vitcli.capture.families.timm_vit import ALL_BLOCK_SITES
from vitcli.capture.family import BlockPlace, Family, Tap
from vitcli.grid import PatchGrid


@dataclass
class PatchFacts:
    """What vitcli's model wrapper reads of timm's `patch_embed`: the input size, the patch size, the projection."""

    img_size: tuple[int, int]
    patch_size: tuple[int, int]
    proj: nn.Module
    norm: nn.Module = field(default_factory=nn.Identity)  # open_clip normalizes no patch row alone


def data_config(preprocess: dict[str, Any]) -> dict[str, Any]:
    """timm's data config from open_clip's preprocessing config (`open_clip.get_model_preprocess_cfg`): resize the
    short side to the input size and centre-crop ('shortest'), or squash to it ('squash')."""
    size = preprocess["size"]
    height, width = (size, size) if isinstance(size, int) else size
    return {
        "input_size": (3, height, width),
        "interpolation": preprocess.get("interpolation", "bicubic"),
        "mean": tuple(preprocess["mean"]),
        "std": tuple(preprocess["std"]),
        "crop_pct": 1.0,
        "crop_mode": "squash" if preprocess.get("resize_mode") == "squash" else "center",
    }


class OpenClipTower(nn.Module):
    """open_clip's image tower dressed as vitcli reads a timm ViT (`pretrained_cfg`, `patch_embed`, `blocks`,
    `embed_dim`, `num_classes` 0, `global_pool`); its forward is the tower's own: the image embedding."""

    pairs_with_text = True  # open_clip models pair it with a text tower (the "text_tower" feature)

    def __init__(self, visual: nn.Module, data_config: dict[str, Any]):
        super().__init__()
        self.visual = visual
        self.pretrained_cfg = data_config
        self.patch_embed = PatchFacts(tuple(visual.image_size), tuple(visual.patch_size), visual.conv1)
        self.global_pool = {"tok": "token", "avg": "avg"}.get(visual.pool_type, visual.pool_type)
        # A zero-shot head (vitcli.zero_shot) reading the image embedding, once labels make the tower a classifier.
        self.classifier: nn.Module | None = None
        # The embedding as timm's ViT names its steps (patches and VitModel.trace read them): the class row and
        # the positions of every row, patch dropout, then ln_pre; a fixed grid.
        self.dynamic_img_size, self.no_embed_class = False, False
        self.patch_drop, self.norm_pre = visual.patch_dropout, visual.ln_pre

    # The readout as timm names it (attribution writes it as one linear map): ln_post on every row before pooling
    # (`norm`) or on the pooled row (`fc_norm`), no classifier head; `embedding_projection` maps the pooled row to the
    # embedding. Properties, so that no module is registered twice in the state dict.
    @property
    def norm(self) -> nn.Module:
        return nn.Identity() if self.visual.final_ln_after_pool else self.visual.ln_post

    @property
    def fc_norm(self) -> nn.Module:
        return self.visual.ln_post if self.visual.final_ln_after_pool else nn.Identity()

    @property
    def head_drop(self) -> nn.Module:
        return nn.Identity()

    @property
    def head(self) -> nn.Module:
        return nn.Identity() if self.classifier is None else self.classifier

    @property
    def num_classes(self) -> int:
        return 0 if self.classifier is None else int(self.classifier.out_features)

    @property
    def num_prefix_tokens(self) -> int:
        return 1

    @property
    def embedding_projection(self) -> Tensor | None:
        return self.visual.proj

    @property
    def pos_embed(self) -> Tensor:
        return self.visual.positional_embedding[None]

    def _pos_embed(self, rows: Tensor) -> Tensor:
        visual = self.visual
        rows = torch.cat([visual.class_embedding.expand(rows.shape[0], 1, -1).to(rows.dtype), rows], dim=1)
        return rows + visual.positional_embedding.to(rows.dtype)

    @property
    def blocks(self) -> nn.ModuleList:
        return self.visual.transformer.resblocks

    @property
    def embed_dim(self) -> int:
        return int(self.visual.transformer.width)

    @property
    def num_features(self) -> int:
        """The image embedding's width (after the projection, when the tower has one): what embedding targets read."""
        return int(self.visual.output_dim) if self.visual.proj is not None else self.embed_dim

    def forward(self, inputs: Tensor) -> Tensor:
        return self.classify(self.visual(inputs))

    def classify(self, embedding: Tensor) -> Tensor:
        """The zero-shot logits of image embeddings, or the embeddings themselves without a classifier."""
        return embedding if self.classifier is None else self.classifier(embedding)

    def forward_features(self, inputs: Tensor) -> Tensor:
        """Every row after the last block and `norm` (timm's forward_features)."""
        return self.norm(self.visual.transformer(self.visual._embeds(inputs)))

    def tail(self, hidden: Tensor) -> Tensor:
        """The tower's forward after its last block: pooling, final norm and projection, as open_clip does them."""
        pooled, _tokens = self.visual._pool(hidden)
        return pooled @ self.visual.proj if self.visual.proj is not None else pooled


def projections(attention: nn.MultiheadAttention, normed: Tensor) -> Tensor:
    """q, k and v of every head from the attention's input: (3, batch, tokens, heads, d)."""
    heads = attention.num_heads
    packed = F.linear(normed, attention.in_proj_weight, attention.in_proj_bias)
    return packed.unflatten(-1, (3, heads, -1)).movedim(-3, 0)


def probabilities(q: Tensor, k: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(d)) per head, (batch, heads, tokens, tokens), from (batch, tokens, heads, d)."""
    scores = q.transpose(1, 2) @ k.transpose(1, 2).transpose(-2, -1)
    return (scores * q.shape[-1] ** -0.5).softmax(dim=-1)


def heads_output(attention: nn.MultiheadAttention, normed: Tensor) -> Tensor:
    """Every head's output, (batch, tokens, heads, d): pattern @ v."""
    q, k, v = projections(attention, normed)
    return (probabilities(q, k) @ v.transpose(1, 2)).transpose(1, 2)


def z_tap(attention: nn.MultiheadAttention) -> Tap:
    """attn.hook_z at the attention's output: computed from its input (kept by a pre-hook, per thread: two batches
    may run at once); a replaced z becomes the output `out_proj(z)`."""
    inputs: dict[int, Tensor] = {}

    def keep(_module: nn.Module, args: tuple[Tensor, ...]) -> None:
        inputs[threading.get_ident()] = args[0]

    def prepare() -> Callable[[], None]:
        return attention.register_forward_pre_hook(keep).remove

    def to_site(_output: Tensor) -> Tensor:
        return heads_output(attention, inputs.pop(threading.get_ident()))

    def to_module(_original: Tensor, site: Tensor) -> Tensor:
        return F.linear(site.flatten(-2), attention.out_proj.weight, attention.out_proj.bias)

    return Tap(attention, "output", to_site, to_module, 0, prepare)


class OpenClipFamily(Family):
    name = "open_clip VisionTransformer"
    block_sites = ALL_BLOCK_SITES | {"ln2.hook_normalized"}
    model_sites = frozenset(("embed.hook_patches",))
    pattern_in_forward = False  # computed from the attention's input beside nn.MultiheadAttention: read-only

    net: OpenClipTower

    def __init__(self, net: nn.Module):
        if not isinstance(net, OpenClipTower):
            import open_clip

            net = OpenClipTower(net, data_config(open_clip.get_model_preprocess_cfg(net)))
        super().__init__(net)
        visual = self.net.visual
        if visual.attn_pool is None and not visual.final_ln_after_pool:
            self.model_sites = self.model_sites | {"ln_final.hook_normalized"}
        if self.net.classifier is not None:
            self.model_sites = self.model_sites | {"head.hook_in"}

    def refusal(self) -> str | None:
        visual = self.net.visual
        if visual.attn_pool is not None:
            return "its tower pools by attention (CoCa), which vitcli does not take apart"
        if not visual.transformer.batch_first:
            return "its transformer runs sequence-first"
        for number, block in enumerate(self.net.blocks, start=1):
            attention = getattr(block, "attn", None)
            standard = (
                type(attention) is nn.MultiheadAttention
                and attention._qkv_same_embed_dim
                and attention.bias_k is None
                and not attention.add_zero_attn
            )
            if type(block).__name__ != "ResidualAttentionBlock" or not standard:
                return f"block {number} is a {type(block).__name__}; vitcli takes apart ResidualAttentionBlock"
        return None

    @property
    def features(self) -> frozenset[str]:
        if self.refusal() is not None:
            return frozenset({"plain_rows"})
        head = {"class_head"} if self.net.classifier is not None else set()
        return frozenset({"pattern", "heads", "replace", "plain_rows", "linear_patches", "positions", *head})

    def blocks(self) -> list[nn.Module]:
        return list(self.net.blocks)

    def places(self) -> list[BlockPlace]:
        grid = self.grid()
        return [
            BlockPlace(number, 1, grid, block.attn.num_heads, block.attn.head_dim)
            for number, block in enumerate(self.net.blocks, start=1)
        ]

    def grid(self) -> PatchGrid:
        height, width = self.net.patch_embed.img_size
        return PatchGrid(height, width, self.net.patch_embed.patch_size[0], ("CLS",))

    @property
    def width(self) -> int:
        return self.net.embed_dim

    @property
    def num_classes(self) -> int:
        return self.net.num_classes

    @property
    def pooling(self) -> str:
        return self.net.global_pool

    def embed(self, inputs: Tensor) -> Tensor:
        return self.net.visual._embeds(inputs)  # conv1, the class embedding, positions, patch dropout, ln_pre

    def pooled(self, inputs: Tensor) -> Tensor:
        return self.net.visual(inputs)

    def run_from(self, number: int, rows: Tensor) -> Tensor:
        for block in self.blocks()[number - 1 :]:
            rows = block(rows)
        return self.net.classify(self.net.tail(rows))

    def block_tap(self, block: nn.Module, place: BlockPlace, kind: str) -> Tap:
        attention = block.attn

        def projection(index: int) -> Callable[[], Tap]:
            return lambda: Tap(attention, "input", lambda normed: projections(attention, normed)[index], None)

        def pattern(normed: Tensor) -> Tensor:
            q, k, _v = projections(attention, normed)
            return probabilities(q, k)

        taps: dict[str, Callable[[], Tap]] = {
            "hook_resid_pre": lambda: Tap(block, "input"),
            "ln1.hook_normalized": lambda: Tap(block.ln_1, "output"),
            "ln2.hook_normalized": lambda: Tap(block.ln_2, "output"),
            "attn.hook_q": projection(0),
            "attn.hook_k": projection(1),
            "attn.hook_v": projection(2),
            "attn.hook_pattern": lambda: Tap(attention, "input", pattern, None),
            "attn.hook_z": lambda: z_tap(attention),
            "hook_attn_out": lambda: Tap(block.ls_1, "output"),
            "hook_mlp_out": lambda: Tap(block.ls_2, "output"),
            "hook_resid_post": lambda: Tap(block, "output"),
        }
        return taps[kind]()

    def model_tap(self, kind: str) -> Tap:
        visual = self.net.visual
        if kind == "embed.hook_patches":
            return Tap(
                visual.conv1,
                "output",
                lambda t: t.flatten(2).transpose(1, 2),
                lambda original, site: site.transpose(1, 2).reshape(original.shape),
            )
        if kind == "ln_final.hook_normalized":
            return Tap(visual.ln_post, "output")
        if kind == "head.hook_in" and self.net.classifier is not None:
            return Tap(self.net.classifier, "input")
        raise KeyError(kind)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "embedding": int(self.net.visual.output_dim)}
