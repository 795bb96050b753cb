"""The self-check every attention view prints, done once here: a block's attention output made from its captured
pattern and values, against the module's own output (its fused path) on the rows it read."""

from __future__ import annotations

import torch
from torch import Tensor

from vitcli.capture.family import Family


def attention_output(family: Family, number: int, pattern: Tensor, values: Tensor) -> Tensor:
    """Block `number`'s attention output (batch, tokens, width) from its pattern (batch, heads, tokens, tokens) and
    values (batch, tokens, heads, d), as captured at attn.hook_pattern and attn.hook_v: each head's rows mixed by its
    pattern (attn.hook_z), then what the module does after."""
    mixed = (pattern @ values.transpose(1, 2)).transpose(1, 2)
    return family.attention_from_heads(number, mixed)


def attention_self_check(family: Family, number: int, normed: Tensor, output: Tensor) -> Tensor:
    """Per image, the largest |output - the module's own output on `normed`| (B,) float64, where `normed` is what
    block `number`'s attention read (ln1.hook_normalized) and `output` what was made of its pattern. One call of the
    module over the whole batch."""
    device = next(family.net.parameters()).device
    with torch.inference_mode():
        own = family.own_attention(number, normed.to(device)).cpu()
    return (own.double() - output.double().cpu()).abs().flatten(1).amax(dim=1)
