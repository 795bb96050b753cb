"""Direct logit attribution: the target logit (or target - contrast) as a sum of what each component wrote.

In a pre-norm ViT the final rows are x_L = x_0 + sum over blocks of (attention output + MLP output), each sublayer
output as the model adds it (layer scale and drop path applied). The attention output is the sum over heads of
z_h W_O,h^T, plus the bias b_O (times layer scale), where z_h is head h's slice of the input of attn.proj. With the
final LayerNorm's scale frozen (vitcli.experiments.readout) the metric is exactly sum of terms + constant; one
forward captures every component, and the result carries the reconstruction against the model's own logits.

By token (one block B): head h's output at row r is sum over sources j of A_h[r, j] v_j W_O,h^T, so each source
token's part of a head's term is A_h[r, j] (v_j W_O,h^T) read out. On families vitcli writes out (timm's ViT) the
attention is recomputed from norm1's output (attend's written-out attention); on the others A and v are as captured
(attn.hook_pattern, attn.hook_v).

An embedding target (vitcli.targets) takes the logit's place: the metric is the pooled embedding read along one
vector w. For --target-direction w is the direction, for --target-feature the unit vector of the feature; the
cosine of --target-image is not linear, so its metric is the pooled embedding projected on REF's normalized
embedding divided by the image's own embedding norm, that norm frozen at this image's value (as the LayerNorm's
scale is): the terms then add up to the cosine itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from vitcli.capture import caching
from vitcli.errors import VitcliError
from vitcli.experiments.readout import LinearReadout, linear_readout
from vitcli.experiments.results import ClassProbability, EmbeddingScore, class_probability
from vitcli.grid import PatchGrid
from vitcli.images import ImageSource
from vitcli.model import PreparedImage, VitModel
from vitcli.target_class import target_or_top1
from vitcli.targets import BoundTarget, output_of

RECONSTRUCTION_TOLERANCE = 1e-4
EMBEDDING, ATTENTION, MLP, HEAD, ATTENTION_BIAS, TOKEN = "embedding", "attn", "mlp", "head", "attn bias", "token"
POOL_MLP = "pool mlp"  # the attention pooling's residual MLP (vitcli.experiments.readout)


@dataclass(frozen=True)
class Term:
    component: str  # EMBEDDING, ATTENTION, MLP, HEAD, ATTENTION_BIAS, TOKEN or POOL_MLP
    block: int | None  # one-based; None for the embedding
    head: int | None  # one-based, for HEAD and TOKEN
    token: int | None  # the source token index (0 = CLS, patch n = token n with one prefix token), for TOKEN
    value: float


@dataclass
class AttributionResult:
    source: ImageSource
    weights_label: str
    by: str  # "block", "head" or "token"
    block: int | None  # the block of --by token
    target: ClassProbability | EmbeddingScore
    contrast: ClassProbability | None
    first_block: int  # the first block decomposed (1; on Swin the last stage's first): its input is the EMBEDDING term
    model_metric: float  # the model's own target logit (minus the contrast's), or the embedding target's score
    constant: float
    terms: list[Term]  # the decomposition --by asked for: they sum, with the constant, to the metric
    block_terms: list[Term]  # embedding, then attention and MLP of every block from first_block (for the bar chart)
    head_terms: np.ndarray  # (blocks, heads) per-head terms of the blocks from first_block (for the heat map)
    bias_terms: np.ndarray  # (blocks,) the attention bias term of each block from first_block
    pool_mlp: float | None  # the attention pooling MLP's term (also last in `terms`); None without attention pooling
    grid: PatchGrid  # the tokens' names and the patches' places
    crop: np.ndarray  # (H, W, 3) uint8, for the --by token figure

    @property
    def token_names(self) -> tuple[str, ...]:
        return tuple(self.grid.token_name(token) for token in range(self.grid.num_tokens))

    @property
    def reconstruction(self) -> float:
        return self.constant + float(np.sum([term.value for term in self.terms]))

    @property
    def difference(self) -> float:
        return abs(self.reconstruction - self.model_metric)


def attribute(
    model: VitModel,
    prepared: PreparedImage,
    target: int | None,
    contrast: int | None,
    by: str,
    block: int | None = None,
    embedding: BoundTarget | None = None,
) -> AttributionResult:
    """One forward (no backward), every component captured; refused when the terms do not rebuild the metric.
    `embedding`: an embedding target attributed instead of a class (`target` and `contrast` are then None)."""
    net, depth = model.net, model.depth
    first = first_decomposed_block(model)
    blocks = range(first, depth + 1)
    sites = [f"blocks.{first}.hook_resid_pre", f"blocks.{depth}.hook_resid_post"]
    sites += [f"blocks.{b}.{name}" for b in blocks for name in ("attn.hook_z", "hook_attn_out", "hook_mlp_out")]
    if by == TOKEN:
        sites += token_sites(model, block)
    with torch.inference_mode(), caching(net, sites) as cache, output_of(model, embedding):
        logits = net(prepared.input[None].to(model.device))[0].float().cpu()
    cache = {site: activation[0].double().cpu() for site, activation in cache.items()}
    final_rows = cache[f"blocks.{depth}.hook_resid_post"]
    if embedding is not None:  # `logits` is the pooled embedding
        readout = linear_readout(net, final_rows, None, None, embedding.readout(logits))
    else:
        target = target_or_top1(target, logits)
        readout = linear_readout(net, final_rows, target, contrast)
    block_terms = [Term(EMBEDDING, None, None, None, readout.term(cache[f"blocks.{first}.hook_resid_pre"]))]
    for b in blocks:
        for component in (ATTENTION, MLP):
            block_terms.append(Term(component, b, None, None, readout.term(cache[f"blocks.{b}.hook_{component}_out"])))
    head_terms, bias_terms = _head_terms(model, cache, readout, blocks)
    terms = _terms(model, cache, readout, by, block, block_terms, head_terms, bias_terms, blocks)
    pool_mlp = readout.pool_mlp if model.family.pooling == "map" else None
    if pool_mlp is not None:
        terms = [*terms, Term(POOL_MLP, None, None, None, pool_mlp)]  # by block, `terms` is `block_terms` itself
    if embedding is not None:
        model_metric = float(embedding.score(logits[None].double())[0])
        followed, contrasted = EmbeddingScore(embedding.target, model_metric), None
    else:
        probabilities = model.probabilities(logits)
        model_metric = float(logits[target].double() - (logits[contrast].double() if contrast is not None else 0.0))
        followed = class_probability(model.labels, target, probabilities)
        contrasted = None if contrast is None else class_probability(model.labels, contrast, probabilities)
    result = AttributionResult(
        prepared.source,
        model.spec.label,
        by,
        block if by == TOKEN else None,
        followed,
        contrasted,
        first,
        model_metric,
        readout.constant,
        terms,
        block_terms,
        head_terms,
        bias_terms,
        pool_mlp,
        model.grid,
        prepared.crop_uint8(),
    )
    if not result.difference <= RECONSTRUCTION_TOLERANCE:
        raise VitcliError(
            f"self-check failed: the attribution terms plus the constant give {result.reconstruction:.6g} but the "
            f"model's {'score' if embedding is not None else 'logit'} is {model_metric:.6g} (difference "
            f"{result.difference:.3g}, tolerance {RECONSTRUCTION_TOLERANCE:g})"
        )
    return result


def first_decomposed_block(model: VitModel) -> int:
    """1 when every block adds to one grid of rows; on Swin the first block of the last stage: patch merging (a
    LayerNorm and a Linear of four rows) is not linear in what earlier blocks added, so the logit is a sum over the
    rows entering the last stage and the last stage's sublayers alone."""
    if "plain_rows" in model.family.features:
        return 1
    places = model.family.places()
    return next(place.number for place in places if place.stage == places[-1].stage)


def _readout_vectors(model: VitModel, block: int, readout: LinearReadout) -> tuple[Tensor, float]:
    """For one block: each row's per-head readout vectors W_O,h^T (gamma * direction_r), (tokens, heads, head_dim),
    and the attention bias's term, (gamma * b_O) . sum of the row directions."""
    weight, bias, scale = attention_output(model, block)
    scaled = scale * readout.directions  # (tokens, width)
    per_head = (scaled @ weight).unflatten(-1, (model.family.places()[block - 1].heads, -1))
    return per_head, 0.0 if bias is None else float(scaled.sum(dim=0) @ bias)


def attention_output(model: VitModel, block: int) -> tuple[Tensor, Tensor | None, Tensor | float]:
    """Block `block`'s attention output projection, float64 on the CPU: W_O (width, heads x head_dim) whose input is
    attn.hook_z, b_O (width,) or None, and the layer scale multiplying both before the residual adds them."""
    family = model.family
    module, place = family.blocks()[block - 1], family.places()[block - 1]
    attention = getattr(module, "attn", None)
    # timm's attn.proj (its attn.hook_z taps attn.norm's input), open_clip's nn.MultiheadAttention out_proj, else
    # transformers' Linear whose input the family taps as attn.hook_z (o_proj, out_proj).
    proj = getattr(attention, "proj", None) or getattr(attention, "out_proj", None)
    if proj is None:
        proj = family.block_tap(module, place, "attn.hook_z").module
    bias = None if proj.bias is None else proj.bias.detach().double().cpu()
    return proj.weight.detach().double().cpu(), bias, _attention_layer_scale(module)


def _attention_layer_scale(module: nn.Module) -> Tensor | float:
    """What multiplies a block's attention output before the residual adds it: timm ViT's ls1 (a LayerScale, or an
    Identity), Eva's and Beit's gamma_1 (a vector, or None), transformers' Dinov2 layer_scale1.lambda1; 1 without
    layer scale."""
    ls1 = getattr(module, "ls1", getattr(module, "ls_1", None))  # open_clip: ls_1
    if ls1 is None and hasattr(module, "layer_scale1"):
        return module.layer_scale1.lambda1.detach().double().cpu()
    gamma = getattr(ls1, "gamma", None) if ls1 is not None else getattr(module, "gamma_1", None)
    return 1.0 if gamma is None else gamma.detach().double().cpu()


def _head_terms(
    model: VitModel, cache: dict[str, Tensor], readout: LinearReadout, blocks: range
) -> tuple[np.ndarray, np.ndarray]:
    heads = np.zeros((len(blocks), model.family.places()[blocks[0] - 1].heads))
    biases = np.zeros(len(blocks))
    for index, b in enumerate(blocks):
        per_head, biases[index] = _readout_vectors(model, b, readout)
        z = cache[f"blocks.{b}.attn.hook_z"]  # (tokens, heads, head_dim)
        heads[index] = torch.einsum("rhd,rhd->h", z, per_head).numpy()
    return heads, biases


def _terms(
    model: VitModel,
    cache: dict[str, Tensor],
    readout: LinearReadout,
    by: str,
    block: int | None,
    block_terms: list[Term],
    head_terms: np.ndarray,
    bias_terms: np.ndarray,
    blocks: range,
) -> list[Term]:
    if by == "block":
        return block_terms
    terms = [block_terms[0]]
    for index, b in enumerate(blocks):
        attention, mlp = block_terms[2 * index + 1], block_terms[2 * index + 2]
        if by == "head":
            terms += [Term(HEAD, b, h + 1, None, float(value)) for h, value in enumerate(head_terms[index])]
        elif b == block:
            terms += _token_terms(model, cache, readout, b)
        else:
            terms += [attention, mlp]
            continue
        terms += [Term(ATTENTION_BIAS, b, None, None, float(bias_terms[index])), mlp]
    return terms


def _token_terms(model: VitModel, cache: dict[str, Tensor], readout: LinearReadout, block: int) -> list[Term]:
    """Each (head, source token) part of block `block`'s head terms."""
    parts, _ = token_parts(model, cache, readout, block)
    return [
        Term(TOKEN, block, h + 1, j, float(parts[h, j])) for h in range(parts.shape[0]) for j in range(parts.shape[1])
    ]


def token_sites(model: VitModel, block: int) -> list[str]:
    """The sites `token_parts` reads of one block, to capture in the forward."""
    if "explicit_forward" in model.family.features:
        return [f"blocks.{block}.ln1.hook_normalized"]
    return [f"blocks.{block}.attn.hook_pattern", f"blocks.{block}.attn.hook_v"]


def token_parts(model: VitModel, cache: dict[str, Tensor], readout: LinearReadout, block: int) -> tuple[Tensor, float]:
    """Block `block`'s head terms split by source token, (heads, tokens) float64, and its attention bias's term
    (what the block's attention adds beside its heads), from a forward that captured `token_sites`."""
    if "explicit_forward" in model.family.features:
        # The fused forward, as before: reading the pattern would run this block unfused (terms move by ~1e-9).
        weight = model.net.blocks[block - 1].attn.qkv.weight
        normed = cache[f"blocks.{block}.ln1.hook_normalized"][None].to(weight)
        with torch.inference_mode():
            _, _, v, attention, _ = model.family.explicit_attention(block, normed)
        attention, v = attention[0].double().cpu(), v[0].transpose(0, 1).double().cpu()
    else:
        attention = cache[f"blocks.{block}.attn.hook_pattern"]  # (heads, rows, sources)
        v = cache[f"blocks.{block}.attn.hook_v"]  # (sources, heads, head_dim)
    per_head, bias = _readout_vectors(model, block, readout)  # (rows, heads, head_dim)
    # part[h, j] = sum over rows r of A_h[r, j] (v_j,h . per_head[r, h]): source j's value as row r reads it
    return torch.einsum("hrj,jhd,rhd->hj", attention, v, per_head), bias
