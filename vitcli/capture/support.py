"""Whether a family can be taken apart at its sites, decided on a meta skeleton before any weights load."""

from __future__ import annotations

from torch import Tensor, nn

from vitcli.capture.families import family_of
from vitcli.errors import UsageError


def pre_norm_refusal(net: nn.Module, name: str) -> str | None:
    """Why `net` cannot be taken apart at its sites (naming what it lacks), or None when it can.

    Works on a meta-device skeleton, so commands refuse a model before its weights load."""
    reason = family_of(net).refusal()
    return None if reason is None else f"{name} is not a pre-norm ViT vitcli can take apart: {reason}"


def require_pre_norm(model_name: str) -> nn.Module:
    """The meta skeleton of `model_name`, refused with UsageError unless its blocks can be taken apart."""
    from vitcli.loading import require_vit

    skeleton = require_vit(model_name)
    refusal = pre_norm_refusal(skeleton, model_name)
    if refusal is not None:
        raise UsageError(refusal)
    return skeleton


def logits_from(net: nn.Module, block: int, rows: Tensor) -> Tensor:
    """The model's own forward on from `rows` entering block `block` (one-based: the value of hook_resid_pre)."""
    return family_of(net).run_from(block, rows)
