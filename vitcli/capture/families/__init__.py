"""Which family adapter wraps a network: decided by the network's class, without importing optional libraries."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from vitcli.capture.family import Family

# Adapters of networks from optional libraries, by (the top-level package that defines the class, class name): their
# modules are imported only when such a network comes, so a timm-only install never imports transformers or open_clip.
LAZY_FAMILIES = {
    ("vitcli", "HFTower"): "vitcli.capture.families.hf:HFFamily",
    ("transformers", "ViTModel"): "vitcli.capture.families.hf:HFFamily",
    ("transformers", "ViTForImageClassification"): "vitcli.capture.families.hf:HFFamily",
    ("transformers", "Dinov2Model"): "vitcli.capture.families.hf:HFFamily",
    ("transformers", "Dinov2WithRegistersModel"): "vitcli.capture.families.hf:HFFamily",
    ("transformers", "CLIPVisionModel"): "vitcli.capture.families.hf:HFFamily",
    ("vitcli", "OpenClipTower"): "vitcli.capture.families.open_clip:OpenClipFamily",
    ("open_clip", "VisionTransformer"): "vitcli.capture.families.open_clip:OpenClipFamily",
}


def family_of(net: nn.Module) -> Family:
    """The adapter for `net`, or ValueError naming its class when vitcli has none."""
    from timm.models.beit import Beit
    from timm.models.eva import Eva
    from timm.models.swin_transformer import SwinTransformer
    from timm.models.vision_transformer import VisionTransformer

    from vitcli.capture.families.timm_beit import TimmBeit
    from vitcli.capture.families.timm_eva import TimmEva
    from vitcli.capture.families.timm_swin import TimmSwin
    from vitcli.capture.families.timm_vit import TimmViT

    if isinstance(net, VisionTransformer):
        return TimmViT(net)
    if isinstance(net, Eva):
        return TimmEva(net)
    if isinstance(net, Beit):
        return TimmBeit(net)
    if isinstance(net, SwinTransformer):
        return TimmSwin(net)
    adapter = LAZY_FAMILIES.get((type(net).__module__.split(".")[0], type(net).__name__))
    if adapter is not None:
        module, name = adapter.split(":")
        return getattr(importlib.import_module(module), name)(net)
    raise ValueError(f"vitcli has no adapter for {type(net).__name__}")


@dataclass(frozen=True)
class Example:
    """One column of docs/models.md's family table: a family adapter (by class name, so that listing it imports no
    optional library), a model of that family or form, and how to build that model's meta skeleton."""

    label: str  # how the table names the family or form
    adapter: str  # the Family subclass family_of gives for the model
    model: str  # what --model takes
    build: Callable[[], nn.Module]


def timm_skeleton(name: str) -> Callable[[], nn.Module]:
    """Builds timm's model `name` on the meta device: shapes only, no weights."""

    def build() -> nn.Module:
        import timm

        return timm.create_model(name, pretrained=False, device="meta")

    return build


def hf_skeleton(class_name: str, config_name: str) -> Callable[[], nn.Module]:
    """Builds transformers' `class_name` from its config class's defaults on the meta device, wrapped as
    `--model hf:FOLDER` wraps it."""

    def build() -> nn.Module:
        import torch
        import transformers

        from vitcli.capture.families.hf import HFTower, default_data_config

        config = getattr(transformers, config_name)()
        with torch.device("meta"):
            model = getattr(transformers, class_name)._from_config(config, attn_implementation="eager")
        return HFTower(model, default_data_config(config))

    return build


def open_clip_skeleton(name: str) -> Callable[[], nn.Module]:
    """Builds open_clip's image tower `name` on the meta device, as `--model open_clip:NAME` does."""

    def build() -> nn.Module:
        from vitcli.loading_towers import tower_skeleton

        return tower_skeleton(f"open_clip:{name}")

    return build


# One representative per family, and per form of a family where commands answer differently; adding a family adds a
# column to docs/models.md (`make docs`).
FAMILIES = [
    Example("timm ViT, CLS", "TimmViT", "vit_tiny_patch16_224", timm_skeleton("vit_tiny_patch16_224")),
    Example(
        "timm ViT, CLS and DIST (DeiT)",
        "TimmViT",
        "deit_tiny_distilled_patch16_224",
        timm_skeleton("deit_tiny_distilled_patch16_224"),
    ),
    Example(
        "timm ViT, CLS and registers (DINOv2)",
        "TimmViT",
        "vit_small_patch14_reg4_dinov2",
        timm_skeleton("vit_small_patch14_reg4_dinov2"),
    ),
    Example(
        "timm ViT, no CLS, mean pooling",
        "TimmViT",
        "vit_medium_patch16_gap_256",
        timm_skeleton("vit_medium_patch16_gap_256"),
    ),
    Example(
        "timm ViT, no CLS, attention pooling (SigLIP)",
        "TimmViT",
        "vit_base_patch16_siglip_224",
        timm_skeleton("vit_base_patch16_siglip_224"),
    ),
    Example("timm Eva (EVA-02)", "TimmEva", "eva02_tiny_patch14_224", timm_skeleton("eva02_tiny_patch14_224")),
    Example("timm Beit", "TimmBeit", "beit_base_patch16_224", timm_skeleton("beit_base_patch16_224")),
    Example("timm Swin", "TimmSwin", "swin_tiny_patch4_window7_224", timm_skeleton("swin_tiny_patch4_window7_224")),
    Example(
        "HF ViTForImageClassification",
        "HFFamily",
        "hf:FOLDER",
        hf_skeleton("ViTForImageClassification", "ViTConfig"),
    ),
    Example("HF Dinov2Model", "HFFamily", "hf:FOLDER", hf_skeleton("Dinov2Model", "Dinov2Config")),
    Example("HF CLIPVisionModel", "HFFamily", "hf:FOLDER", hf_skeleton("CLIPVisionModel", "CLIPVisionConfig")),
    Example("open_clip tower", "OpenClipFamily", "open_clip:ViT-B-32", open_clip_skeleton("ViT-B-32")),
]
