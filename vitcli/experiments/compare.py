"""Same model, different inputs: the images' CLS rows block by block, the classifier readout, CLS vs mean pooling,
and the similarity of their final features.

One forward per image (the model's own, batched) with forward hooks on the blocks, the final norm and the head;
the readout logit = w_c . h + b_c is recomputed from the head's input h and checked against the model's logit.
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from vitcli.capture import block_site, caching, resid_pre_site
from vitcli.errors import UsageError, VitcliError
from vitcli.experiments.results import ClassScore, top_classes
from vitcli.experiments.trace import full_float32
from vitcli.grid import PatchGrid
from vitcli.images import ImageSource
from vitcli.model import PreparedImage, VitModel
from vitcli.spec import ascii_number

# Two CLS rows "differ" when ||a - b|| > DIFFER_TOLERANCE * max(||a||, ||b||): far above float32 rounding (1e-7),
# far below any difference two real images make after attention has mixed their patches in.
DIFFER_TOLERANCE = 1e-5
SELF_CHECK_TOLERANCE = 1e-4  # largest |w_c . h + b_c - the model's logit| allowed
TOP_DIMENSIONS = 10
POOLINGS = {"token": "CLS row", "avg": "mean of the patch rows"}
# Per-pair detail (depth trajectories, their table columns, lines and legend entries) is kept for A~B and the pairs
# asked for, never for every pair: N images have N (N - 1) / 2 pairs. Every pair's final similarity is in the matrix.
MAX_PAIRS = 10


def letter(index: int) -> str:
    """Images are called A, B, C ... in tables and figures (then I27, I28 ...)."""
    return string.ascii_uppercase[index] if index < 26 else f"I{index + 1}"


def parse_pairs(text: str, count: int) -> list[tuple[int, int]]:
    """`--pairs`: comma-separated pairs of images by letter or by 1-based number (`A~C,B~D`, `1~3`, `I27~A`), or
    `all` (up to MAX_PAIRS pairs); A~B always comes first (the summary's pair), then the pairs asked for."""
    names = {letter(index).casefold(): index for index in range(count)}
    if text.strip().casefold() == "all":
        asked = [(first, second) for first in range(count) for second in range(first + 1, count)]
    else:
        asked = [_pair(part, names, count) for part in text.split(",")]
    pairs = list(dict.fromkeys([(0, 1), *asked]))
    if len(pairs) > MAX_PAIRS:
        raise UsageError(
            f"--pairs asks for {len(pairs)} pairs (A~B included); at most {MAX_PAIRS} get the per-pair detail, and "
            "every pair's final similarity is in the matrix"
        )
    return pairs


def _pair(part: str, names: dict[str, int], count: int) -> tuple[int, int]:
    sides = part.strip().split("~")
    if len(sides) != 2:
        raise UsageError(f"--pairs {part.strip()!r} is not a pair: write two images joined by ~ (A~C or 1~3)")
    indices = []
    for side in sides:
        side = side.strip()
        number = ascii_number(side)
        index = number - 1 if number is not None else names.get(side.casefold())
        if index is None or not 0 <= index < count:
            last = letter(count - 1)
            raise UsageError(f"--pairs {part.strip()!r}: no image {side!r} among {count} (A..{last}, or 1..{count})")
        indices.append(index)
    if indices[0] == indices[1]:
        raise UsageError(f"--pairs {part.strip()!r} pairs an image with itself")
    return min(indices), max(indices)


@dataclass(frozen=True)
class Contribution:
    dimension: int  # zero-based index into h
    feature: float  # h_i
    weight: float  # w_c,i
    product: float  # w_c,i * h_i


@dataclass
class ClassReadout:
    index: int
    label: str
    dot: float  # w_c . h
    bias: float  # b_c
    logit: float  # w_c . h + b_c
    model_logit: float  # the model's own output for this class
    probability: float  # exp(logit - max logit) / sum_j exp(logit_j - max logit)
    top_dimensions: list[Contribution]  # the TOP_DIMENSIONS largest |w_c,i h_i|, largest first


@dataclass
class PoolingReadout:
    pooling: str  # "token" or "avg"
    description: str  # "CLS row", "mean of the patch rows"
    is_model_own: bool  # whether this is the readout the model's forward uses (its global_pool)
    top: list[ClassScore]


@dataclass
class ImageComparison:
    source: ImageSource
    crop: np.ndarray  # (H, W, 3) uint8, for figures
    top: list[ClassScore]
    max_logit: float  # the softmax step: p_c = exp(z_c - max_logit) / shifted_exp_sum
    shifted_exp_sum: float
    readouts: list[ClassReadout]
    poolings: list[PoolingReadout]


@dataclass
class PairTrajectory:
    """Two images' rows through the depth; index 0 is the rows entering block 1, index b the rows leaving block b."""

    first: int  # index into CompareResult.images
    second: int
    cls_cosine: list[float]
    cls_distance: list[float]  # L2
    patch_mean_cosine: list[float]  # between the means of the patch rows
    patch_mean_distance: list[float]
    cls_input_distance: float  # L2 between the CLS rows entering block 1 (parameter + position: identical)
    first_query_distance: float  # L2 between the CLS queries of block 1 (attn.hook_q: after any q norm), all heads
    first_differing_block: int | None  # first block whose CLS output rows differ (DIFFER_TOLERANCE); None: never


@dataclass
class PatchMatches:
    """For each patch of image A, the patch of image B whose final (normalized) row has the largest cosine."""

    best_match: list[int]  # patch numbers in B, for P1..PN of A
    best_cosine: list[float]


@dataclass
class CompareResult:
    weights: str
    model_name: str
    grid: PatchGrid
    model_pooling: str  # the model's own global_pool
    images: list[ImageComparison]
    pairs: list[PairTrajectory]  # A~B first, then the pairs asked for
    cls_cosine_matrix: list[list[float]]  # final normalized CLS rows, N x N
    patch_matches: PatchMatches | None  # only for exactly two images
    readout_error: float  # largest |w_c . h + b_c - model logit| over images and chosen classes
    pooling_error: float  # largest |the model's own pooling readout, recomputed - model logits|


def compare_images(
    model: VitModel,
    images: list[PreparedImage],
    classes: Sequence[int] = (),
    top_k: int = 5,
    pairs: Sequence[tuple[int, int]] = ((0, 1),),
) -> CompareResult:
    """Compare two or more images through the same model; the readout's classes (indices, see resolve_class)
    default to each image's top-1; `pairs` (indices, see parse_pairs) get their trajectories through the depth."""
    net = model.net
    if len(images) < 2:
        raise UsageError("compare needs at least two images")
    if not isinstance(getattr(net, "head", None), nn.Linear) or not hasattr(net, "fc_norm"):
        raise VitcliError(f"cannot compare readouts of {model.name}: vitcli reads one linear head after timm's fc_norm")
    if not 1 <= top_k <= model.num_classes:
        raise UsageError(f"--top-k must be between 1 and {model.num_classes} (the model's classes), not {top_k}")
    chosen = list(dict.fromkeys(classes))
    if any(not 0 <= index < model.num_classes for index in chosen):
        raise UsageError(f"classes must be between 0 and {model.num_classes - 1}, not {chosen}")
    captured = _forward(model, [image.input for image in images])
    logits = captured["logits"]
    if not chosen:
        chosen = list(dict.fromkeys(int(row.argmax()) for row in logits))
    weight, bias = net.head.weight.detach().float().cpu(), net.head.bias.detach().float().cpu()
    comparisons, readout_error, pooling_error = [], 0.0, 0.0
    for index, image in enumerate(images):
        h, row_logits = captured["head_input"][index], logits[index]
        max_logit = float(row_logits.max())
        shifted = float((row_logits - max_logit).exp().sum())
        readouts = [_readout(model, weight[c], float(bias[c]), h, c, row_logits, max_logit, shifted) for c in chosen]
        readout_error = max([readout_error] + [abs(r.logit - r.model_logit) for r in readouts])
        poolings, own_logits = _poolings(model, captured["final"][index], top_k)
        if own_logits is not None:
            pooling_error = max(pooling_error, float((own_logits - row_logits).abs().max()))
        top = _ranked(model, row_logits, top_k)
        comparisons.append(
            ImageComparison(image.source, image.crop_uint8(), top, max_logit, shifted, readouts, poolings)
        )
    if max(readout_error, pooling_error) > SELF_CHECK_TOLERANCE:
        raise VitcliError(
            f"compare self-check failed: the recomputed readout differs from the model's logits by "
            f"{max(readout_error, pooling_error):.3g} (tolerance {SELF_CHECK_TOLERANCE:g})"
        )
    if any(not 0 <= index < len(images) for pair in pairs for index in pair):
        raise UsageError(f"pairs must name images 0..{len(images) - 1}, not {list(pairs)}")
    trajectories = [_trajectory(captured, first, second) for first, second in pairs]
    final_cls = torch.nn.functional.normalize(captured["final"][:, 0], dim=-1)
    matches = _patch_matches(model.grid, captured["final"][0], captured["final"][1]) if len(images) == 2 else None
    return CompareResult(
        model.spec.label, model.name, model.grid, net.global_pool, comparisons, trajectories,
        (final_cls @ final_cls.T).tolist(), matches, readout_error, pooling_error,
    )  # fmt: skip


def _forward(model: VitModel, inputs: list[Tensor]) -> dict[str, Tensor]:
    """The model's own forward, batched, through the capture layer: CLS rows and patch-row means at every depth,
    block 1's CLS query, the final normalized rows, the head's input and the logits (all on the CPU, float32). Memory
    grows by what is kept per image (its final rows, 197 x D): each chunk's inputs are stacked on their own, and what
    is kept of a chunk's block outputs is copied out of them (a view would hold every block's rows alive)."""
    net, prefix = model.net, model.grid.num_prefix
    depth_sites = [resid_pre_site(1)] + [block_site(block, "hook_resid_post") for block in range(1, model.depth + 1)]
    query_site = block_site(1, "attn.hook_q")
    sites = [*depth_sites, query_site, "ln_final.hook_normalized", "head.hook_in"]
    parts: dict[str, list[Tensor]] = {name: [] for name in ("cls", "patch_mean", "query", "final", "head_input")}
    logits = []
    with torch.inference_mode(), full_float32(), caching(net, sites) as cache:
        for start in range(0, len(inputs), model.batch_size):
            chunk = torch.stack(inputs[start : start + model.batch_size])
            logits.append(net(chunk.to(model.device)).float().cpu())
            depth_rows = [cache[site].float().cpu() for site in depth_sites]
            # (batch, depth + 1, D), copied by stack
            parts["cls"].append(torch.stack([rows[:, 0] for rows in depth_rows], dim=1))
            parts["patch_mean"].append(torch.stack([rows[:, prefix:].mean(1) for rows in depth_rows], dim=1))
            parts["query"].append(cache[query_site][:, 0].flatten(-2).float().cpu().clone())  # heads joined
            parts["final"].append(cache["ln_final.hook_normalized"].float().cpu())
            parts["head_input"].append(cache["head.hook_in"].float().cpu())
    captured = {name: torch.cat(values).cpu() for name, values in parts.items()}
    captured["logits"] = torch.cat(logits)
    return captured


def _readout(model, weight_row, bias, h, index, row_logits, max_logit, shifted) -> ClassReadout:
    products = weight_row * h
    dot = float(products.sum(dtype=torch.float64))
    largest = products.abs().topk(min(TOP_DIMENSIONS, products.numel())).indices.tolist()
    contributions = [Contribution(i, float(h[i]), float(weight_row[i]), float(products[i])) for i in largest]
    logit = dot + bias
    probability = math.exp(logit - max_logit) / shifted
    return ClassReadout(
        index, model.labels[index], dot, bias, logit, float(row_logits[index]), probability, contributions
    )


def _poolings(model: VitModel, final: Tensor, top_k: int) -> tuple[list[PoolingReadout], Tensor | None]:
    """The same head on the CLS row and on the mean of the patch rows (both through fc_norm, as timm's head path)."""
    net = model.net
    include_prefix = getattr(net, "pool_include_prefix", False)  # timm's ViT only; Eva and Beit average patches
    own_readout = net.global_pool if not (net.global_pool == "avg" and include_prefix) else None
    pooled = {"token": final[0], "avg": final[model.grid.num_prefix :].mean(0)}
    readouts, own_logits = [], None
    with torch.inference_mode():
        for pooling, vector in pooled.items():
            logits = net.head(net.fc_norm(vector.to(model.device))).float().cpu()
            if pooling == own_readout:
                own_logits = logits
            readouts.append(
                PoolingReadout(pooling, POOLINGS[pooling], pooling == own_readout, _ranked(model, logits, top_k))
            )
    return readouts, own_logits


def _ranked(model: VitModel, logits: Tensor, top_k: int) -> list[ClassScore]:
    return top_classes(logits, logits.softmax(-1), model.labels, top_k)


def _trajectory(captured: dict[str, Tensor], first: int, second: int) -> PairTrajectory:
    cls_a, cls_b = captured["cls"][first], captured["cls"][second]
    mean_a, mean_b = captured["patch_mean"][first], captured["patch_mean"][second]
    cls_distance = (cls_a - cls_b).norm(dim=-1)
    scale = torch.maximum(cls_a.norm(dim=-1), cls_b.norm(dim=-1))
    differing = [
        block for block in range(1, len(cls_distance)) if cls_distance[block] > DIFFER_TOLERANCE * scale[block]
    ]
    return PairTrajectory(
        first,
        second,
        torch.nn.functional.cosine_similarity(cls_a, cls_b, dim=-1).tolist(),
        cls_distance.tolist(),
        torch.nn.functional.cosine_similarity(mean_a, mean_b, dim=-1).tolist(),
        (mean_a - mean_b).norm(dim=-1).tolist(),
        float(cls_distance[0]),
        float((captured["query"][first] - captured["query"][second]).norm()),
        differing[0] if differing else None,
    )


def _patch_matches(grid: PatchGrid, final_a: Tensor, final_b: Tensor) -> PatchMatches:
    rows_a = torch.nn.functional.normalize(final_a[grid.num_prefix :], dim=-1)
    rows_b = torch.nn.functional.normalize(final_b[grid.num_prefix :], dim=-1)
    best = (rows_a @ rows_b.T).max(dim=1)
    return PatchMatches([index + 1 for index in best.indices.tolist()], best.values.tolist())
