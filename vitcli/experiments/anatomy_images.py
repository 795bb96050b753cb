"""What a ViT does with space over a folder of images: attention distance, CKA between blocks, PCA of patch features
to RGB, and high-norm tokens (`vitcli anatomy --view distance,cka,pca,norms`).

One forward of the model's own per batch serves every view asked for, with the rows leaving each block cached
(`components.caching`, sites blocks.B.hook_resid_post) and, when a view needs them (distance, norms), the attention
probabilities (blocks.B.attn.hook_pattern). Each view is an accumulator fed batch by batch and finished
once, so a folder streams: distance, CKA and norms keep per-image numbers or sums only; PCA keeps each image's
last-block patch features (images x patches x width floats) because the RGB maps need the folder's components first.

Blocks count from 1 in every result, as everywhere in vitcli; arrays indexed by block put block b at index b - 1.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator
from itertools import islice
from typing import Any

import torch
from torch import Tensor

from vitcli.capture import hooks, pattern_site
from vitcli.experiments.anatomy_accumulators import (
    CkaAccumulator,
    DistanceAccumulator,
    NormsAccumulator,
    PcaAccumulator,
    Reading,
)
from vitcli.experiments.anatomy_types import (  # noqa: F401  (re-exported: the results live here for callers)
    ATTENTION_VIEWS,
    CKA_EXAMPLE,
    CKA_MIN_IMAGES,
    DEFAULT_CKA_MINIBATCH,
    DEFAULT_NORM_FACTOR,
    DEFAULT_PCA_THRESHOLD,
    DISTANCE_NOTE,
    IMAGE_VIEWS,
    NORMS_NOTE,
    PCA_FEATURES,
    CkaResult,
    DistanceResult,
    ImageAnatomy,
    NormOutlier,
    NormsResult,
    PcaResult,
)
from vitcli.images import ImageSource
from vitcli.model import PreparedImage, VitModel

READING_BUDGET_BYTES = 2 * 1024**3  # what one batch's cache may hold (attention of every block is most of it)


def measure(
    model: VitModel,
    images: Iterable[PreparedImage],
    views: Collection[str],
    *,
    pca_threshold: float = DEFAULT_PCA_THRESHOLD,
    norm_factor: float = DEFAULT_NORM_FACTOR,
    cka_minibatch: int = DEFAULT_CKA_MINIBATCH,
    progress: Callable[[int], None] | None = None,
) -> ImageAnatomy:
    """Every view in `views` (a subset of IMAGE_VIEWS) over the images, one forward per batch.

    `images` may be a lazy iterable: it is read batch by batch. progress(n) is called after each batch with the
    number of images done. Raises ValueError for an unknown view or for cka over fewer than CKA_MIN_IMAGES images
    (the command checks the count first, as a usage error).
    """
    unknown = set(views) - set(IMAGE_VIEWS)
    if unknown:
        raise ValueError(f"unknown image views {sorted(unknown)}; known: {', '.join(IMAGE_VIEWS)}")
    grid, depth = model.grid, model.depth
    accumulators: dict[str, Any] = {}
    if "distance" in views:
        accumulators["distance"] = DistanceAccumulator(grid)
    if "cka" in views:
        accumulators["cka"] = CkaAccumulator(depth, cka_minibatch)
    if "pca" in views:
        accumulators["pca"] = PcaAccumulator(grid, pca_threshold)
    if "norms" in views:
        accumulators["norms"] = NormsAccumulator(grid, norm_factor)
    with_attention = bool(ATTENTION_VIEWS & set(views))
    sources: list[ImageSource] = []
    waiting: deque[list[ImageSource]] = deque()  # the sources of the batches handed to the forwards, in order

    def inputs() -> Iterator[Tensor]:
        for batch in _batches(images, reading_batch_size(model, with_attention)):
            waiting.append([image.source for image in batch])
            yield torch.stack([image.input for image in batch])

    for reading in readings(model, inputs(), with_attention):
        for accumulator in accumulators.values():
            accumulator.add(reading)
        sources.extend(waiting.popleft())
        if progress is not None:
            progress(len(sources))
    if not sources:
        raise ValueError("no images to measure")
    if "cka" in views and len(sources) < CKA_MIN_IMAGES:
        raise ValueError(f"CKA needs at least {CKA_MIN_IMAGES} images, not {len(sources)}")
    anatomy = ImageAnatomy(sources)
    for view, accumulator in accumulators.items():
        result = accumulator.finish() if view == "cka" else accumulator.finish(sources)
        result.weights = model.spec.label
        setattr(anatomy, view, result)
    return anatomy


def readings(model: VitModel, batches: Iterable[Tensor], with_attention: bool) -> Iterator[Reading]:
    """For each (B, 3, H, W) batch of normalized inputs, in order, one forward of the model's own with what the views
    read cached: the rows leaving every block (blocks.B.hook_resid_post) and, with attention, every block's
    probabilities (blocks.B.attn.hook_pattern).

    The forwards run through `VitModel.stream`, as the model's plain forward does (two batches at once on a CPU), so
    each thread keeps its own batch's activations: the hooks write into a thread-local cache.
    """
    net, depth = model.net, model.depth
    residual_sites = [f"blocks.{block}.hook_resid_post" for block in range(1, depth + 1)]
    pattern_sites = [pattern_site(block) for block in range(1, depth + 1)] if with_attention else []
    local = threading.local()

    def keeper(site: str) -> Callable[[Tensor], None]:
        def keep(activation: Tensor) -> None:
            local.cache[site] = activation

        return keep

    def forward(inputs: Tensor) -> tuple[Tensor, ...]:
        local.cache = {}
        net.forward_features(inputs)
        cache = local.cache
        final = net.norm(cache[residual_sites[-1]])
        return (*(cache[site] for site in residual_sites), final, *(cache[site] for site in pattern_sites))

    with hooks(net, {site: keeper(site) for site in residual_sites + pattern_sites}):
        for output in model.stream(forward, batches):
            attention = list(output[depth + 1 :]) if with_attention else None
            yield Reading(list(output[:depth]), output[depth], attention)


def read_batch(model: VitModel, inputs: Tensor, with_attention: bool) -> Reading:
    """The reading of one batch (see `readings`)."""
    return next(readings(model, [inputs], with_attention))


def reading_batch_size(model: VitModel, with_attention: bool) -> int:
    """The model's batch size, made smaller when a batch's kept attention (every block, every head: N^2 floats each)
    would pass READING_BUDGET_BYTES: DINOv2 at 518 pixels keeps about half a gigabyte per image."""
    if not with_attention:
        return model.batch_size
    grid = model.grid
    per_image = 4 * model.depth * (model.num_heads * grid.num_tokens**2 + grid.num_tokens * model.embed_dim)
    return max(1, min(model.batch_size, READING_BUDGET_BYTES // per_image))


def _batches(images: Iterable[PreparedImage], size: int) -> Iterator[list[PreparedImage]]:
    waiting = iter(images)
    while batch := list(islice(waiting, size)):
        yield batch
