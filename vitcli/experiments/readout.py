"""The model's readout of the final rows, made linear by freezing what is not: each LayerNorm's scale and, with
attention pooling, the pooling's probabilities and its MLP's output, all at the values this image's forward computed.

A head reads a pooled vector: the CLS row (global_pool 'token'), the mean of the patch rows ('avg'), or an attention
pooling's output ('map', timm's AttentionPoolLatent: latent queries attend to the rows, proj(pattern @ v), then
x + mlp(norm(x))). Around the pooling sit at most one LayerNorm (`norm` on every row before pooling, or `fc_norm`
after it), then a Linear head, or for an open_clip tower a projection to the image embedding. A distilled DeiT
averages two heads, `head` on the CLS row and `head_dist` on the distillation token's row.

With those values frozen, the pooled vector is an affine map of the final rows x (tokens, width):

    pooled = part(x) + constant + pool_mlp

`part` is linear: x_r is normalized by its frozen deviation (centred, times gamma), then pooled with fixed weights per
row, or, for attention pooling, read as sum over heads h and rows j of A_h[j] W_proj,h W_v,h n_j with the pooling's
frozen probabilities A; the pooled vector's LayerNorm and the projection follow. `constant` gathers the biases
(LayerNorm beta, the pooling's v and proj biases, its position embedding). `pool_mlp` is the attention pooling's
residual MLP output (zero for token and mean pooling): its input is the pooled attention output, which every
component shares, so it stays one term of its own. The final rows are a sum of components, so each component's part
is `part` applied to it alone (EmbeddingReadout); a scalar metric read along a vector w (a class row difference, an
embedding target) has one direction per row, w's adjoint through `part` (LinearReadout).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812  (the usual name)
from torch import Tensor, nn


@dataclass(frozen=True)
class LinearReadout:
    directions: Tensor  # (tokens, width) float64: what each final row is read with
    constant: float  # the biases' part of the metric
    pool_mlp: float = 0.0  # the attention pooling MLP's part of the metric

    def term(self, component: Tensor) -> float:
        """The metric's part carried by one (tokens, width) component of the final rows."""
        return float((component.double() * self.directions).sum())


@dataclass(frozen=True)
class EmbeddingReadout:
    """The pooled embedding (what `model.family.pooled` returns: the classifier's input, or an open_clip tower's image
    embedding) as part(final rows) + constant + pool_mlp, each (D,) float64."""

    part: Callable[[Tensor], Tensor]  # (tokens, width) component -> (D,), linear
    constant: Tensor
    pool_mlp: Tensor


def readout_refusal(net: nn.Module, name: str, head: bool = True) -> str | None:
    """Why the head of `net` (head=False: its pooled embedding) cannot be made linear this way, or None (works on a
    meta skeleton)."""
    attention_pooling = getattr(net, "attn_pool", None)
    if attention_pooling is None and net.global_pool not in ("token", "avg"):
        return f"{name} pools with {net.global_pool!r}; attribution follows the CLS row, the mean or attention pooling"
    if attention_pooling is not None and type(attention_pooling).__name__ != "AttentionPoolLatent":
        return f"{name} pools with a {type(attention_pooling).__name__}; attribution reads timm's AttentionPoolLatent"
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


def _double(tensor: Tensor | None) -> Tensor | None:
    return None if tensor is None else tensor.detach().double().cpu()


class _FrozenLayerNorm:
    """A LayerNorm with its deviation frozen at the value computed for `reference` (..., width): affine in its input,
    linear without its bias."""

    def __init__(self, norm: nn.Module, reference: Tensor):
        self.norm = norm
        self.identity = isinstance(norm, nn.Identity)
        if not self.identity:
            self.gamma, self.beta = _double(norm.weight), _double(norm.bias)
            self.deviation = (reference.var(dim=-1, unbiased=False, keepdim=True) + norm.eps).sqrt()

    def __call__(self, values: Tensor, affine: bool) -> Tensor:
        if self.identity:
            return values
        normalized = (values - values.mean(dim=-1, keepdim=True)) / self.deviation
        if self.gamma is not None:
            normalized = normalized * self.gamma
        return normalized + self.beta if affine and self.beta is not None else normalized


class _Pooling:
    """One pooled vector (width,) of the normalized final rows (tokens, width) with fixed weights per row, or through
    timm's AttentionPoolLatent with its probabilities frozen; `pool_mlp` is that pooling's MLP output (width,)."""

    def __init__(self, weights: Tensor | None, attention_pooling: nn.Module | None, first: int, normalized: Tensor):
        self.weights, self.first = weights, first
        self.pool_mlp = torch.zeros(normalized.shape[-1], dtype=torch.float64)
        if attention_pooling is None:
            return
        from vitcli.capture.families.timm_vit import explicit_latent_attention

        pool = copy.deepcopy(attention_pooling).double().cpu()
        with torch.no_grad():
            pattern, attended = explicit_latent_attention(pool, normalized[None, first:])
            outputs = attended + pool.mlp(pool.norm(attended)) if pool.mlp is not None else attended
        # The latents' weights in the output: their mean ('avg'), else the first (timm's SigLIP has one latent)
        latents = pattern.shape[2]
        latent_weights = torch.zeros(latents, dtype=torch.float64)
        if pool.pool == "avg":
            latent_weights[:] = 1.0 / latents
        else:
            latent_weights[0] = 1.0
        # Each head's weight on each row, over the latents the output keeps: (heads, rows)
        self.probabilities = torch.einsum("l,hlj->hj", latent_weights, pattern[0])
        self.pool_mlp = latent_weights @ (outputs - attended)[0]
        self.kv_weight, self.kv_bias = _double(pool.kv.weight), _double(pool.kv.bias)
        self.proj_weight, self.proj_bias = _double(pool.proj.weight), _double(pool.proj.bias)
        self.position = None if pool.pos_embed is None else _double(pool.pos_embed)
        self.heads = pool.num_heads

    def __call__(self, normalized: Tensor, affine: bool) -> Tensor:
        if self.weights is not None:
            return self.weights @ normalized
        rows = normalized[self.first :]
        if affine and self.position is not None:
            rows = rows + self.position
        width = rows.shape[-1]
        v_weight, v_bias = self.kv_weight[width:], None if self.kv_bias is None else self.kv_bias[width:]
        values = F.linear(rows, v_weight, v_bias if affine else None).unflatten(-1, (self.heads, -1))
        attended = torch.einsum("hj,jhd->hd", self.probabilities, values).flatten()
        return F.linear(attended, self.proj_weight, self.proj_bias if affine else None)


def _pool_weights(net: nn.Module, tokens: int) -> list[tuple[float, Tensor | None, nn.Module]]:
    """(share of the logits, pooling weights (tokens,) float64 or None for attention pooling, Linear) of every
    classifier head."""
    if hasattr(net, "head_dist"):  # timm's VisionTransformerDistilled: (head(CLS) + head_dist(DIST)) / 2
        cls, dist = torch.zeros(tokens, dtype=torch.float64), torch.zeros(tokens, dtype=torch.float64)
        cls[0], dist[1] = 1.0, 1.0
        return [(0.5, cls, net.head), (0.5, dist, net.head_dist)]
    if getattr(net, "attn_pool", None) is not None:
        return [(1.0, None, _classifier(net))]
    pool = torch.zeros(tokens, dtype=torch.float64)
    if net.global_pool == "token":
        pool[0] = 1.0
    else:
        # timm's Eva and Beit average the patch rows alone and have no pool_include_prefix
        first = 0 if getattr(net, "pool_include_prefix", False) else getattr(net, "num_prefix_tokens", 0)
        pool[first:] = 1.0 / (tokens - first)
    return [(1.0, pool, _classifier(net))]


def _attention_pooling_start(net: nn.Module) -> int:
    """The first row an attention pooling reads: timm's ViT drops the prefix rows unless pool_include_prefix; Eva's
    reads every row."""
    if hasattr(net, "pool_include_prefix") and not net.pool_include_prefix:
        return getattr(net, "num_prefix_tokens", 0)
    return 0


class _FrozenReadout:
    """Every pooled vector of `net` for the final rows `rows` as affine maps: (share, map, pool_mlp, head) per head."""

    def __init__(self, net: nn.Module, rows: Tensor):
        row_norm, pooled_norm = _final_norms(net)
        self.row_norm = _FrozenLayerNorm(row_norm, rows)
        normalized = self.row_norm(rows, affine=True)
        self.projection = _double(
            getattr(net, "embedding_projection", None)
        )  # open_clip: the embedding is pooled @ proj
        self.paths = []
        for share, weights, head in _pool_weights(net, rows.shape[0]):
            pooling = _Pooling(weights, getattr(net, "attn_pool", None), _attention_pooling_start(net), normalized)
            pooled = pooling(normalized, affine=True) + pooling.pool_mlp
            self.paths.append((share, pooling, _FrozenLayerNorm(pooled_norm, pooled), head))

    def pooled(self, path: int, component: Tensor, affine: bool) -> Tensor:
        """The pooled vector's part (D,) carried by a (tokens, width) component, with the biases when affine."""
        _, pooling, pooled_norm, _ = self.paths[path]
        return self._after_pooling(pooled_norm, pooling(self.row_norm(component, affine), affine), affine)

    def pool_mlp(self, path: int) -> Tensor:
        _, pooling, pooled_norm, _ = self.paths[path]
        return self._after_pooling(pooled_norm, pooling.pool_mlp, affine=False)

    def _after_pooling(self, pooled_norm: _FrozenLayerNorm, pooled: Tensor, affine: bool) -> Tensor:
        pooled = pooled_norm(pooled, affine)
        return pooled @ self.projection if self.projection is not None else pooled


def _rows(final_rows: Tensor) -> Tensor:
    # clone(): rows captured under inference mode become ordinary tensors that autograd may read
    return final_rows.detach().double().cpu().clone()


def linear_readout(
    net: nn.Module, final_rows: Tensor, target: int | None, contrast: int | None, vector: Tensor | None = None
) -> LinearReadout:
    """The readout for one image, from its (tokens, width) rows leaving the last block: of the target class's logit
    (minus the contrast's), or with `vector` (D,) of the pooled embedding's dot product with it. Each row's direction
    is the adjoint of the frozen linear map applied to the class rows' difference (computed by autograd in float64:
    the map is linear, so its gradient is exactly the adjoint)."""
    rows = _rows(final_rows)
    frozen = _FrozenReadout(net, rows)
    component = torch.zeros_like(rows, requires_grad=True)
    metric = torch.zeros((), dtype=torch.float64)
    constant, pool_mlp = 0.0, 0.0
    for path, (share, _, _, head) in enumerate(frozen.paths):
        if vector is not None:  # the pooled embedding read along one vector: no head, no bias
            read = vector.double().cpu()
        else:
            weight, bias = _double(head.weight), _double(head.bias)
            read = weight[target] - (weight[contrast] if contrast is not None else 0.0)
            if bias is not None:
                constant += share * float(bias[target] - (bias[contrast] if contrast is not None else 0.0))
        with torch.no_grad():
            constant += share * float(frozen.pooled(path, torch.zeros_like(rows), affine=True) @ read)
            pool_mlp += share * float(frozen.pool_mlp(path) @ read)
        with torch.enable_grad():
            metric = metric + share * (frozen.pooled(path, component, affine=False) @ read)
    (directions,) = torch.autograd.grad(metric, component)
    return LinearReadout(directions, constant, pool_mlp)


def embedding_readout(net: nn.Module, final_rows: Tensor) -> EmbeddingReadout:
    """The pooled embedding of one image as a linear map of its (tokens, width) final rows plus constants; refused
    (ValueError) for a distilled DeiT, whose two heads read two rows and pool no single vector."""
    if hasattr(net, "head_dist"):
        raise ValueError("a distilled model's two heads pool no single embedding")
    rows = _rows(final_rows)
    frozen = _FrozenReadout(net, rows)
    with torch.no_grad():
        constant = frozen.pooled(0, torch.zeros_like(rows), affine=True)
        pool_mlp = frozen.pool_mlp(0)

    def part(component: Tensor) -> Tensor:
        with torch.no_grad():
            return frozen.pooled(0, component.detach().double().cpu(), affine=False)

    return EmbeddingReadout(part, constant, pool_mlp)
