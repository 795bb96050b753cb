"""Which family adapter wraps a network: decided by the network's class, without importing optional libraries."""

from __future__ import annotations

import importlib

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
