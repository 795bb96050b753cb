"""Which family adapter wraps a network: decided by the network's class, without importing optional libraries."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from vitcli.capture.family import Family


def family_of(net: nn.Module) -> Family:
    """The adapter for `net`, or ValueError naming its class when vitcli has none."""
    from timm.models.vision_transformer import VisionTransformer

    from vitcli.capture.families.timm_vit import TimmViT

    if isinstance(net, VisionTransformer):
        return TimmViT(net)
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
]
