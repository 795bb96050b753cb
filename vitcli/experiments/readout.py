"""The classifier's readout of the final rows, made linear by freezing the final LayerNorm's scale.

The head reads a pooled vector: the CLS row (global_pool 'token') or the mean of the patch rows ('avg'), through one
LayerNorm (`norm` on every row before pooling, or `fc_norm` after it) and a Linear. With the LayerNorm's standard
deviation frozen at the value this image's forward computed, the target logit (or target - contrast) is

    metric = sum over rows r of weight_r * (x_r . direction) + constant

for the final rows x (tokens, width): direction = centred(gamma * (w_target - w_contrast)) (centring absorbs the
LayerNorm's mean subtraction), weight_r = pooling weight of row r / that row's (or the pooled vector's) standard
deviation, constant = beta . (w_target - w_contrast) + b_target - b_contrast. The final rows are a sum of
components, so each component's term is the same expression applied to it alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class LinearReadout:
    row_weights: Tensor  # (tokens,) float64
    direction: Tensor  # (width,) float64
    constant: float

    def term(self, component: Tensor) -> float:
        """The metric's part carried by one (tokens, width) component of the final rows."""
        return float(self.row_weights @ (component.double() @ self.direction))


def readout_refusal(net: nn.Module, name: str) -> str | None:
    """Why the head of `net` cannot be made linear this way, or None (works on a meta skeleton)."""
    if getattr(net, "attn_pool", None) is not None or net.global_pool not in ("token", "avg"):
        return f"{name} pools with {net.global_pool!r}; attribution follows heads that read the CLS row or the mean"
    if type(net.head_drop) not in (nn.Dropout, nn.Identity) or not isinstance(net.head, nn.Linear):
        return f"{name}'s classifier head is not one Linear layer"
    norms = [module for module in (net.norm, net.fc_norm) if not isinstance(module, nn.Identity)]
    if len(norms) > 1 or any(not isinstance(module, nn.LayerNorm) for module in norms):
        found = ", ".join(type(module).__name__ for module in norms)
        return f"{name} ends with {found}; attribution needs at most one final LayerNorm"
    if hasattr(net, "head_dist"):
        return f"{name} reads two heads (class and distillation token); attribution follows models with one"
    return None


def pooling_weights(net: nn.Module, tokens: int) -> Tensor:
    """(tokens,) float64: how the head's pool weighs each final row."""
    weights = torch.zeros(tokens, dtype=torch.float64)
    if net.global_pool == "token":
        weights[0] = 1.0
    else:
        first = 0 if net.pool_include_prefix else net.num_prefix_tokens
        weights[first:] = 1.0 / (tokens - first)
    return weights


def linear_readout(net: nn.Module, final_rows: Tensor, target: int, contrast: int | None) -> LinearReadout:
    """The readout for one image, from its (tokens, width) rows leaving the last block."""
    rows = final_rows.double()
    pool = pooling_weights(net, rows.shape[0]).to(rows.device)
    weight = net.head.weight.detach().double()
    bias = net.head.bias.detach().double() if net.head.bias is not None else torch.zeros(weight.shape[0])
    classes = weight[target] - (weight[contrast] if contrast is not None else 0.0)
    constant = float(bias[target] - (bias[contrast] if contrast is not None else 0.0))
    norm = next((module for module in (net.norm, net.fc_norm) if isinstance(module, nn.LayerNorm)), None)
    if norm is None:
        return LinearReadout(pool, classes, constant)
    gamma = norm.weight.detach().double() if norm.weight is not None else torch.ones_like(classes)
    beta = norm.bias.detach().double() if norm.bias is not None else torch.zeros_like(classes)
    direction = gamma * classes
    direction = direction - direction.mean()
    if norm is net.norm:  # every row normalized by its own deviation, then pooled
        deviation = (rows.var(dim=-1, unbiased=False) + norm.eps).sqrt()
    else:  # the pooled vector normalized once
        deviation = ((pool @ rows).var(unbiased=False) + norm.eps).sqrt().expand(rows.shape[0])
    return LinearReadout(pool / deviation, direction, constant + float(beta @ classes))
