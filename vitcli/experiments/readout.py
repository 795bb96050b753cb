"""The classifier's readout of the final rows, made linear by freezing the final LayerNorm's scale.

A head reads a pooled vector: the CLS row (global_pool 'token') or the mean of the patch rows ('avg'), through one
LayerNorm (`norm` on every row before pooling, or `fc_norm` after it) and a Linear; a distilled DeiT averages two
such heads, `head` on the CLS row and `head_dist` on the distillation token's row. With each LayerNorm's standard
deviation frozen at the value this image's forward computed, the target logit (or target - contrast) is

    metric = sum over rows r of (x_r . direction_r) + constant

for the final rows x (tokens, width): direction_r = sum over heads of share * pool_r / deviation * centred(gamma *
(w_target - w_contrast)) (centring absorbs the LayerNorm's mean subtraction; share 1, or 1/2 for each distilled
head), constant = sum over heads of share * (beta . (w_target - w_contrast) + b_target - b_contrast). The final
rows are a sum of components, so each component's term is the same expression applied to it alone.

An embedding target (vitcli.targets) reads the pooled embedding (the head's input) along one vector w instead of
the head's class rows: w - 0 takes the place of w_target - w_contrast and there is no head bias. Its DLA needs no
Linear head, so it also runs on headless models.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class LinearReadout:
    directions: Tensor  # (tokens, width) float64: what each final row is read with
    constant: float

    def term(self, component: Tensor) -> float:
        """The metric's part carried by one (tokens, width) component of the final rows."""
        return float((component.double() * self.directions).sum())


def readout_refusal(net: nn.Module, name: str, head: bool = True) -> str | None:
    """Why the head of `net` (head=False: its pooled embedding) cannot be made linear this way, or None (works on a
    meta skeleton)."""
    if getattr(net, "attn_pool", None) is not None or net.global_pool not in ("token", "avg"):
        return f"{name} pools with {net.global_pool!r}; attribution follows heads that read the CLS row or the mean"
    heads = [_classifier(net)] + ([net.head_dist] if hasattr(net, "head_dist") else [])
    if type(_head_drop(net)) not in (nn.Dropout, nn.Identity):
        return f"{name}'s classifier head is not one Linear layer"
    if head and not all(isinstance(module, nn.Linear) for module in heads):
        return f"{name}'s classifier head is not one Linear layer"
    norms = [module for module in _final_norms(net) if not isinstance(module, nn.Identity)]
    if len(norms) > 1 or any(not isinstance(module, nn.LayerNorm) for module in norms):
        found = ", ".join(type(module).__name__ for module in norms)
        return f"{name} ends with {found}; attribution needs at most one final LayerNorm"
    return None


def _classifier(net: nn.Module) -> nn.Module:
    """The Linear reading the pooled vector: `head`, or Swin's `head.fc` (its head pools, drops out, then fc)."""
    return getattr(net.head, "fc", net.head)


def _head_drop(net: nn.Module) -> nn.Module:
    return net.head_drop if hasattr(net, "head_drop") else net.head.drop


def _final_norms(net: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(norm on every row, norm on the pooled vector); Swin has the first alone."""
    return net.norm, getattr(net, "fc_norm", nn.Identity())


def _heads(net: nn.Module, tokens: int) -> list[tuple[float, Tensor, nn.Linear]]:
    """(share of the logits, pooling weights (tokens,) float64, Linear) of every classifier head."""
    if hasattr(net, "head_dist"):  # timm's VisionTransformerDistilled: (head(CLS) + head_dist(DIST)) / 2
        cls, dist = torch.zeros(tokens, dtype=torch.float64), torch.zeros(tokens, dtype=torch.float64)
        cls[0], dist[1] = 1.0, 1.0
        return [(0.5, cls, net.head), (0.5, dist, net.head_dist)]
    pool = torch.zeros(tokens, dtype=torch.float64)
    if net.global_pool == "token":
        pool[0] = 1.0
    else:
        # timm's Eva and Beit average the patch rows alone and have no pool_include_prefix
        first = 0 if getattr(net, "pool_include_prefix", False) else getattr(net, "num_prefix_tokens", 0)
        pool[first:] = 1.0 / (tokens - first)
    return [(1.0, pool, _classifier(net))]


def linear_readout(
    net: nn.Module, final_rows: Tensor, target: int | None, contrast: int | None, vector: Tensor | None = None
) -> LinearReadout:
    """The readout for one image, from its (tokens, width) rows leaving the last block: of the target class's logit
    (minus the contrast's), or with `vector` (width,) of the pooled embedding's dot product with it."""
    rows = final_rows.double().cpu()
    norm = next((module for module in _final_norms(net) if isinstance(module, nn.LayerNorm)), None)
    directions = torch.zeros_like(rows)
    constant = 0.0
    for share, pool, head in _heads(net, rows.shape[0]):
        if vector is not None:  # the pooled embedding read along one vector: no head, no bias
            classes = vector.double().cpu()
            projection = getattr(net, "embedding_projection", None)  # open_clip: the embedding is pooled @ proj
            if projection is not None:
                classes = projection.detach().double().cpu() @ classes
        else:
            weight = head.weight.detach().double().cpu()
            bias = head.bias.detach().double().cpu() if head.bias is not None else torch.zeros(weight.shape[0])
            classes = weight[target] - (weight[contrast] if contrast is not None else 0.0)
            constant += share * float(bias[target] - (bias[contrast] if contrast is not None else 0.0))
        if norm is None:
            directions += share * pool[:, None] * classes
            continue
        gamma = norm.weight.detach().double().cpu() if norm.weight is not None else torch.ones_like(classes)
        beta = norm.bias.detach().double().cpu() if norm.bias is not None else torch.zeros_like(classes)
        direction = gamma * classes
        direction = direction - direction.mean()
        if norm is net.norm:  # every row normalized by its own deviation, then pooled
            deviation = (rows.var(dim=-1, unbiased=False) + norm.eps).sqrt()
        else:  # the pooled vector normalized once
            deviation = ((pool @ rows).var(unbiased=False) + norm.eps).sqrt().expand(rows.shape[0])
        directions += share * (pool / deviation)[:, None] * direction
        constant += share * float(beta @ classes)
    return LinearReadout(directions, constant)
