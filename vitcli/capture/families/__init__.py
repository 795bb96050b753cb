"""Which family adapter wraps a network: decided by the network's class, without importing optional libraries."""

from __future__ import annotations

from torch import nn

from vitcli.capture.family import Family


def family_of(net: nn.Module) -> Family:
    """The adapter for `net`, or ValueError naming its class when vitcli has none."""
    from timm.models.beit import Beit
    from timm.models.eva import Eva
    from timm.models.vision_transformer import VisionTransformer

    from vitcli.capture.families.timm_beit import TimmBeit
    from vitcli.capture.families.timm_eva import TimmEva
    from vitcli.capture.families.timm_vit import TimmViT

    if isinstance(net, VisionTransformer):
        return TimmViT(net)
    if isinstance(net, Eva):
        return TimmEva(net)
    if isinstance(net, Beit):
        return TimmBeit(net)
    raise ValueError(f"vitcli has no adapter for {type(net).__name__}")
