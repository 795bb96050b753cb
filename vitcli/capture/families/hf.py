"""Hugging Face `transformers` image models: ViTModel, ViTForImageClassification, Dinov2Model,
Dinov2WithRegistersModel and CLIPVisionModel.

All are pre-norm ViTs with a class token (CLS, token 0; DINOv2's registers R1..Rn follow it) and separate q, k, v
and output projections, so every block site is a module's input or output; only the attention pattern is read-only
(the eager attention function's returned probabilities: replacing them would not change the output it already
computed). transformers is never imported here: the modules are found by their attribute names, which differ per
model (`Layout`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from vitcli.capture.families.timm_vit import ALL_BLOCK_SITES, heads_at_input
from vitcli.capture.family import BlockPlace, Family, Tap
from vitcli.grid import PatchGrid

# The transformers documentation's defaults of each model's image processor, for folders without a
# preprocessor_config.json: ViTImageProcessor squashes to the input size (bilinear, mean and std 0.5);
# Dinov2's BitImageProcessor resizes the short side to 256 and crops 224 (bicubic, ImageNet mean and std);
# CLIPImageProcessor resizes the short side to the crop size and crops (bicubic, OpenAI CLIP mean and std).
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
DEFAULT_PREPROCESSING = {
    "vit": {"interpolation": "bilinear", "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "crop_pct": 1.0,
            "crop_mode": "squash"},
    "dinov2": {"interpolation": "bicubic", "mean": IMAGENET_MEAN, "std": IMAGENET_STD, "crop_pct": 224 / 256,
               "crop_mode": "center"},
    "dinov2_with_registers": {"interpolation": "bicubic", "mean": IMAGENET_MEAN, "std": IMAGENET_STD,
                              "crop_pct": 224 / 256, "crop_mode": "center"},
    "clip_vision_model": {"interpolation": "bicubic", "mean": CLIP_MEAN, "std": CLIP_STD, "crop_pct": 1.0,
                          "crop_mode": "center"},
}  # fmt: skip


@dataclass(frozen=True)
class Layout:
    """Where one transformers model keeps what the sites need, as attribute paths."""

    model_type: str  # config.model_type
    layers: str  # the blocks, from the net's root
    final_norm: str  # the last norm, from the net's root (CLIP's normalizes the class token alone)
    patch_proj: str  # the Conv2d embedding the patches, from the net's root
    attention: str  # in a block: the attention module, which returns (output, probabilities)
    out_proj: str  # in the attention: the output projection (its input is attn.hook_z)
    ln1: str  # in a block: the norm the attention reads
    attn_out: str  # in a block: the module whose output is what the attention sublayer adds (see attn_out_index)
    attn_out_index: int | None
    mlp_out: str  # in a block: the module whose output is what the MLP sublayer adds
    classifier: str | None = None  # from the net's root


LAYOUTS = {
    "ViTModel": Layout(
        "vit", "layers", "layernorm", "embeddings.patch_embeddings.projection", "attention", "o_proj",
        "layernorm_before", "attention", 0, "mlp",
    ),
    "ViTForImageClassification": Layout(
        "vit", "vit.layers", "vit.layernorm", "vit.embeddings.patch_embeddings.projection", "attention", "o_proj",
        "layernorm_before", "attention", 0, "mlp", classifier="classifier",
    ),
    "Dinov2Model": Layout(
        "dinov2", "encoder.layer", "layernorm", "embeddings.patch_embeddings.projection", "attention", "o_proj",
        "norm1", "layer_scale1", None, "layer_scale2",
    ),
    "Dinov2WithRegistersModel": Layout(
        "dinov2_with_registers", "encoder.layer", "layernorm", "embeddings.patch_embeddings.projection", "attention",
        "o_proj", "norm1", "layer_scale1", None, "layer_scale2",
    ),
    "CLIPVisionModel": Layout(
        "clip_vision_model", "encoder.layers", "post_layernorm", "embeddings.patch_embedding", "self_attn",
        "out_proj", "layer_norm1", "self_attn", 0, "mlp",
    ),
}  # fmt: skip


def module_at(root: nn.Module, path: str) -> Any:
    for part in path.split("."):
        root = getattr(root, part)
    return root


def missing_modules(model: nn.Module) -> list[str]:
    """The attribute paths of its Layout this model lacks (another transformers version may name them otherwise)."""
    layout = LAYOUTS[type(model).__name__]
    paths = [layout.layers, layout.final_norm, layout.patch_proj, *([layout.classifier] if layout.classifier else [])]
    attention = f"{layout.layers}.0.{layout.attention}"
    paths += [f"{attention}.{name}" for name in ("q_proj", "k_proj", "v_proj", layout.out_proj)]
    paths += [f"{layout.layers}.0.{name}" for name in (layout.ln1, layout.attn_out, layout.mlp_out)]
    missing = []
    for path in paths:
        try:
            module_at(model, path)
        except (AttributeError, IndexError):
            missing.append(path)
    return missing


@dataclass
class PatchFacts:
    """What vitcli's model wrapper reads of timm's `patch_embed`: the input size, the patch size, the projection."""

    img_size: tuple[int, int]
    patch_size: tuple[int, int]
    proj: nn.Module


def default_data_config(config: Any) -> dict[str, Any]:
    """timm's data config from a transformers config alone: its image size with the model's documented defaults."""
    size = int(config.image_size)
    return {"input_size": (3, size, size), **DEFAULT_PREPROCESSING[config.model_type]}


class HFTower(nn.Module):
    """A transformers image model dressed as vitcli reads a timm ViT: `pretrained_cfg` (timm's data config of its
    preprocessing), `patch_embed`, `blocks`, `embed_dim`, `num_classes`, `global_pool`; its forward returns the
    classifier's logits, or the pooled embedding of a model without a classifier."""

    def __init__(self, model: nn.Module, data_config: dict[str, Any] | None = None):
        super().__init__()
        self.model = model
        self.layout = LAYOUTS[type(model).__name__]
        self.pretrained_cfg = data_config or default_data_config(model.config)
        patch = int(model.config.patch_size)
        self.patch_embed = PatchFacts(
            tuple(self.pretrained_cfg["input_size"][1:]), (patch, patch), module_at(model, self.layout.patch_proj)
        )
        self.global_pool = "token"

    @property
    def blocks(self) -> nn.ModuleList:
        return module_at(self.model, self.layout.layers)

    @property
    def embed_dim(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def num_classes(self) -> int:
        return int(self.model.config.num_labels) if self.layout.classifier else 0

    @property
    def num_features(self) -> int:
        """The pooled embedding's width (timm's name): every class pools a row of the hidden width."""
        return self.embed_dim

    # timm's readout path, which vitcli's readers follow (lens, probe, attribution, anatomy): the final norm on every
    # row (CLIP's normalizes the class token alone, the same row, as LayerNorm normalizes each row by itself), the
    # class token's row, the classifier (nothing without one).
    num_prefix_tokens = property(lambda self: 1 + int(getattr(self.model.config, "num_register_tokens", 0)))
    fc_norm = property(lambda self: nn.Identity())
    head_drop = property(lambda self: nn.Identity())

    @property
    def norm(self) -> nn.Module:
        return module_at(self.model, self.layout.final_norm)

    @property
    def head(self) -> nn.Module:
        return module_at(self.model, self.layout.classifier) if self.layout.classifier else nn.Identity()

    @property
    def pos_embed(self) -> Tensor:
        """(1, 1 + patches, width): the position embeddings the model adds at its input size, CLS's first (timm's
        layout), by the model's own interpolation where that size is not its config's."""
        embeddings = module_at(self.model, self.layout.patch_proj.split(".patch_")[0])
        height, width = self.patch_embed.img_size
        patches = (height // self.patch_embed.patch_size[0]) * (width // self.patch_embed.patch_size[1])
        proj = self.patch_embed.proj
        rows = torch.zeros(1, 1 + patches, self.embed_dim, dtype=proj.weight.dtype, device=proj.weight.device)
        return embeddings.interpolate_pos_encoding(rows, height, width)

    def forward_features(self, inputs: Tensor) -> Tensor:
        """Every row after the last block and the final norm (timm's forward_features)."""
        hidden = self.model(pixel_values=inputs, output_hidden_states=True, **self._resized(inputs)).hidden_states[-1]
        return self.norm(hidden)

    def forward_head(self, rows: Tensor, pre_logits: bool = False) -> Tensor:
        """The class token's row of the final normalized rows, through the classifier unless `pre_logits`."""
        return rows[:, 0] if pre_logits else self.head(rows[:, 0])

    def _resized(self, inputs: Tensor) -> dict[str, Any]:
        """Dinov2 always interpolates its position embeddings; ViT and CLIP only when asked, for other sizes."""
        size = int(self.model.config.image_size)
        if not self.layout.model_type.startswith("dinov2") and tuple(inputs.shape[-2:]) != (size, size):
            return {"interpolate_pos_encoding": True}
        return {}

    def forward(self, inputs: Tensor) -> Tensor:
        output = self.model(pixel_values=inputs, **self._resized(inputs))
        if self.layout.classifier:
            return output.logits
        return self.pooled_output(output.last_hidden_state, output.pooler_output)

    def pooled_output(self, last_hidden: Tensor, pooler_output: Tensor | None) -> Tensor:
        """CLIP's pooler output (its final norm of the class token); on ViT and DINOv2 the class token after the
        final norm, as timm's pre_logits. ViTModel's pooler (dense + tanh) is left out: converted checkpoints such
        as DINO's carry it untrained, and no classifier reads it."""
        return pooler_output if self.layout.model_type == "clip_vision_model" else last_hidden[:, 0]

    def pooled(self, inputs: Tensor) -> Tensor:
        """The pooled embedding: a classifier's input (the class token after the final norm), else forward()."""
        if not self.layout.classifier:
            return self.forward(inputs)
        return self.model.vit(pixel_values=inputs, **self._resized(inputs)).last_hidden_state[:, 0]

    def tail(self, hidden: Tensor) -> Tensor:
        """The forward after the last block, as each model's own forward computes it."""
        final_norm = module_at(self.model, self.layout.final_norm)
        if self.layout.model_type == "clip_vision_model":
            return final_norm(hidden[:, 0])
        row = final_norm(hidden)[:, 0]
        return module_at(self.model, self.layout.classifier)(row) if self.layout.classifier else row


def eager_attention(attention: nn.Module) -> Callable[[], Callable[[], None]]:
    """A Tap's preparation: transformers' eager attention, the one that returns its probabilities, while hooked
    (eager and SDPA logits agree to 1.5e-7, ../shared/NOTES.md)."""

    def prepare() -> Callable[[], None]:
        config = attention.config
        was = config._attn_implementation
        config._attn_implementation = "eager"

        def undo() -> None:
            config._attn_implementation = was

        return undo

    return prepare


def split_heads(module: nn.Module, heads: int) -> Tap:
    """A projection's (batch, tokens, heads x d) output as (batch, tokens, heads, d): q, k or v."""
    return Tap(module, "output", lambda t: t.unflatten(-1, (heads, -1)), lambda _original, site: site.flatten(-2))


class _Entered(Exception):
    """Stops a forward at block 1's input (HFFamily.embed)."""


class HFFamily(Family):
    name = "Hugging Face transformers ViT"
    block_sites = ALL_BLOCK_SITES
    model_sites = frozenset(("embed.hook_patches", "ln_final.hook_normalized"))

    net: HFTower

    def __init__(self, net: nn.Module):
        super().__init__(net if isinstance(net, HFTower) else HFTower(net))
        self.layout = self.net.layout
        if self.layout.classifier:
            self.model_sites = self.model_sites | {"head.hook_in"}
        if self.layout.model_type == "clip_vision_model":  # its final norm sees the class token alone
            self.model_sites = self.model_sites - {"ln_final.hook_normalized"}

    @property
    def features(self) -> frozenset[str]:
        features = {"pattern", "heads", "replace", "plain_rows", "linear_patches", "positions"}
        return frozenset(features | ({"class_head"} if self.layout.classifier else set()))

    def blocks(self) -> list[nn.Module]:
        return list(self.net.blocks)

    def places(self) -> list[BlockPlace]:
        grid, config = self.grid(), self.net.model.config
        heads = int(config.num_attention_heads)
        return [BlockPlace(number, 1, grid, heads, self.width // heads) for number in range(1, len(self.blocks()) + 1)]

    def grid(self) -> PatchGrid:
        height, width = self.net.patch_embed.img_size
        registers = int(getattr(self.net.model.config, "num_register_tokens", 0))  # DINOv2 with registers
        names = ("CLS", *(f"R{index}" for index in range(1, registers + 1)))
        return PatchGrid(height, width, self.net.patch_embed.patch_size[0], names)

    @property
    def width(self) -> int:
        return self.net.embed_dim

    @property
    def num_classes(self) -> int:
        return self.net.num_classes

    @property
    def pooling(self) -> str:
        return "token"

    def pooled(self, inputs: Tensor) -> Tensor:
        return self.net.pooled(inputs)

    def embed(self, inputs: Tensor) -> Tensor:
        """The rows entering block 1 as the model's own embeddings compute them (CLIP's pre-norm included): its
        forward stopped there, so every model's embedding (interpolated positions, registers) is its own."""
        entering: list[Tensor] = []

        def stop(_module: nn.Module, args: tuple[Tensor, ...]) -> None:
            entering.append(args[0])
            raise _Entered

        handle = self.blocks()[0].register_forward_pre_hook(stop)
        try:
            self.net.forward(inputs)
        except _Entered:
            pass
        finally:
            handle.remove()
        return entering[0]

    def run_from(self, number: int, rows: Tensor) -> Tensor:
        for block in self.blocks()[number - 1 :]:
            rows = block(rows, None)
        return self.net.tail(rows)

    def block_tap(self, block: nn.Module, place: BlockPlace, kind: str) -> Tap:
        layout = self.layout
        attention = module_at(block, layout.attention)
        taps: dict[str, Callable[[], Tap]] = {
            "hook_resid_pre": lambda: Tap(block, "input"),
            "ln1.hook_normalized": lambda: Tap(module_at(block, layout.ln1), "output"),
            "attn.hook_q": lambda: split_heads(attention.q_proj, place.heads),
            "attn.hook_k": lambda: split_heads(attention.k_proj, place.heads),
            "attn.hook_v": lambda: split_heads(attention.v_proj, place.heads),
            "attn.hook_pattern": lambda: Tap(
                attention, "output", to_module=None, output_index=1, prepare=eager_attention(attention)
            ),
            "attn.hook_z": lambda: heads_at_input(module_at(attention, layout.out_proj), place.heads),
            "hook_attn_out": lambda: Tap(
                module_at(block, layout.attn_out), "output", output_index=layout.attn_out_index
            ),
            "hook_mlp_out": lambda: Tap(module_at(block, layout.mlp_out), "output"),
            "hook_resid_post": lambda: Tap(block, "output"),
        }
        return taps[kind]()

    def model_tap(self, kind: str) -> Tap:
        net, layout = self.net, self.layout
        if kind == "embed.hook_patches":
            return Tap(
                net.patch_embed.proj,
                "output",
                lambda t: t.flatten(2).transpose(1, 2),
                lambda original, site: site.transpose(1, 2).reshape(original.shape),
            )
        if kind == "ln_final.hook_normalized":
            return Tap(module_at(net.model, layout.final_norm), "output")
        if kind == "head.hook_in" and layout.classifier:
            return Tap(module_at(net.model, layout.classifier), "input")
        raise KeyError(kind)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "class": type(self.net.model).__name__}
