"""Explanation maps for one target class on the patch grid: gradient relevance, grad-rollout, Grad-CAM, attention,
rollout, occlusion, the pixel-gradient methods, the direct contributions (dla) and two baselines that read the image
alone (random, edge), optionally scored by deletion and insertion curves.

The gradient methods share one forward and one backward of the target logit through the model's own modules, with
the attention and block B's features and their gradients kept (vitcli.experiments.explain_gradients, which also
makes their maps); the result carries how far that pass's logits are from the eval forward's. Every map keeps its raw
values: nothing is min-max normalized here.

An embedding target (vitcli.targets: --target-image, --target-direction, --target-feature) takes the logit's place:
every pass then ends at the pooled embedding and differentiates, covers or scores the target's score instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import Tensor

from vitcli import explain_methods as registry
from vitcli.capture import unfused_attention as unfused_attention  # importable from here, as before
from vitcli.errors import UsageError, VitcliError
from vitcli.experiments.attention import patch_map, require_attention
from vitcli.experiments.baselines import baseline_map
from vitcli.experiments.dla import DirectDecomposition, direct_decomposition, dla_definition, dla_map
from vitcli.experiments.explain_gradients import (
    capture_gradients,
    grad_rollout_map,
    gradcam_layer,
    gradcam_map,
    relevance_map,
)
from vitcli.experiments.explain_options import GradientOptions, check_gradient_options
from vitcli.experiments.faithfulness import Faithfulness, FaithfulnessOptions, check_options, count_forwards
from vitcli.experiments.faithfulness import faithfulness as faithfulness_curves
from vitcli.experiments.gradients import PixelAttribution, count_backwards, pixel_attribution
from vitcli.experiments.occlusion import SlidingWindows, fill_image, occlude_patches
from vitcli.experiments.results import ClassProbability, EmbeddingScore, class_probability
from vitcli.experiments.rollout import attention_rollout, check_rollout_options
from vitcli.grid import PatchGrid
from vitcli.images import ImageSource
from vitcli.model import PreparedImage, VitModel
from vitcli.target_class import resolve_target
from vitcli.targets import BoundTarget, output_of

# ----- results


@dataclass
class MethodMap:
    method: str
    values: np.ndarray  # (grid rows, grid cols) float64, raw: entry [r, c] belongs to patch r * cols + c + 1
    unit: str
    definition: str  # what was computed, with its parameters
    attribution: PixelAttribution | None = None  # the pixel methods' raw attribution and signed patch sums
    decomposition: DirectDecomposition | None = None  # dla's parts of every token and the rest of the metric


@dataclass
class Explanation:
    source: ImageSource
    crop: np.ndarray  # (H, W, 3) uint8: what the model saw
    grid: PatchGrid
    weights_label: str
    target: ClassProbability | EmbeddingScore  # the explained class with its clean probability, or embedding target
    top1: ClassProbability | None  # None when an embedding target is explained (the forward ends at the embedding)
    block: int  # one-based block whose norm1 output Grad-CAM reads and whose attention `attention` shows
    fill: str  # what covered pixels become, for occlusion and the faithfulness curves
    maps: list[MethodMap]
    output_difference: float | None  # max |logits under the hooks - eval forward|; None when no hooked pass ran
    faithfulness: Faithfulness | None = None
    contrast: ClassProbability | None = None  # the gradient methods and dla explain logit(target) - logit(contrast)
    audits: Any = None  # explain_audits.Audits when any audit ran: localisation, robustness, ROAD, sanity


# ----- options


def check_methods(methods: Iterable[str]) -> list[str]:
    chosen = list(dict.fromkeys(methods))
    unknown = [method for method in chosen if method not in registry.METHOD_NAMES]
    if unknown:
        raise UsageError(f"unknown --method {unknown[0]!r}: choose from {', '.join(registry.METHOD_NAMES)}")
    if not chosen:
        raise UsageError(f"choose at least one --method: {', '.join(registry.METHOD_NAMES)}")
    return chosen


def resolve_block(model: VitModel, block: int | None) -> int:
    """The one-based block for Grad-CAM and attention; default the last (pytorch-grad-cam's ViT recipe)."""
    if block is None:
        return model.depth
    if not 1 <= block <= model.depth:
        raise UsageError(f"--block must be between 1 and {model.depth} (the model's blocks), not {block}")
    return block


def count_work(
    model: VitModel,
    methods: Sequence[str],
    options: FaithfulnessOptions | None,
    gradient_options: GradientOptions | None = None,
) -> int:
    """Passes `explain` reports through on_progress: occlusion's covers, the pixel methods' backward passes and the
    faithfulness curves."""
    covers = model.map_grid.num_patches * len(registry.COVERING_METHODS & set(methods))
    backwards = count_backwards(list(methods), gradient_options or GradientOptions())
    return covers + backwards + (count_forwards(len(methods), options) if options is not None else 0)


# ----- explain


def explain(
    model: VitModel,
    prepared: PreparedImage,
    methods: Sequence[str],
    target: str | None = None,
    block: int | None = None,
    fill: str = "gray",
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    faithfulness: FaithfulnessOptions | None = None,
    on_progress: Callable[[int], None] | None = None,
    clean_logits: Tensor | None = None,
    contrast: str | None = None,
    gradient_options: GradientOptions | None = None,
    embedding: BoundTarget | None = None,
) -> Explanation:
    """Each method's raw map for the target class (default the clean top-1), and optionally their curves.

    clean_logits: the model's eval forward of the image, when the caller has it (else it runs here).
    contrast: a class whose logit the gradient methods and dla subtract from the target's ("why target rather than
    this").
    embedding: an embedding target, explained instead of a class (`target` and `contrast` are then None).
    """
    methods = check_methods(methods)
    block = resolve_block(model, block)
    gradient_options = gradient_options or GradientOptions()
    check_gradient_options(gradient_options)
    if faithfulness is not None:
        check_options(model.map_grid, faithfulness)
    if registry.ROLLOUT_METHODS & set(methods):
        check_rollout_options(head_fusion, discard_ratio)
    if embedding is not None:
        followed, top1, contrasted, clean_logits = _embedding_target(model, prepared, embedding)
    else:
        followed, top1, contrasted, clean_logits = _class_target(model, prepared, target, contrast, clean_logits)
    contrast_index = None if contrasted is None else contrasted.index
    settings = MapSettings(block, fill, head_fusion, discard_ratio, gradient_options, contrast_index)
    followed_index = embedding if embedding is not None else followed.index
    maps, output_difference = method_maps(model, prepared, methods, followed_index, settings, on_progress, clean_logits)
    curves = None
    if faithfulness is not None:
        values = {item.method: item.values for item in maps}
        fill_pixels = fill_image(model, prepared, fill)
        curves = faithfulness_curves(
            model, prepared.input, fill_pixels, values, followed_index, faithfulness, on_progress
        )
    return Explanation(
        prepared.source,
        prepared.crop_uint8(),
        model.map_grid,
        model.spec.label,
        followed,
        top1,
        block,
        fill,
        maps,
        output_difference,
        curves,
        contrasted,
    )


def _class_target(
    model: VitModel, prepared: PreparedImage, target: str | None, contrast: str | None, clean_logits: Tensor | None
) -> tuple[ClassProbability, ClassProbability, ClassProbability | None, Tensor]:
    """The explained class, the clean top-1 and the contrast class with their clean probabilities, and the logits."""
    if clean_logits is None:
        clean_logits = model.logits(prepared.input[None])[0]
    clean = model.probabilities(clean_logits.float().cpu())
    target_index = resolve_target(model, target, clean)
    contrast_index = None if contrast is None else resolve_target(model, contrast, clean)
    if contrast_index == target_index:
        if target is None:  # known only now: this image's top-1 is the contrast class
            raise VitcliError(f"the clean top-1 class {target_index} is the --contrast class: give --target")
        raise UsageError(f"--contrast {contrast} is the target class {target_index}: choose another class")

    def scored(index: int) -> ClassProbability:
        return class_probability(model.labels, index, clean)

    contrasted = None if contrast_index is None else scored(contrast_index)
    return scored(target_index), scored(int(clean.argmax())), contrasted, clean_logits


def _embedding_target(
    model: VitModel, prepared: PreparedImage, target: BoundTarget
) -> tuple[EmbeddingScore, None, None, None]:
    """The embedding target with its clean score; no top-1 and no contrast (the forward ends at the embedding)."""
    with output_of(model, target):
        score = float(target.score(model.logits(prepared.input[None]))[0])
    return EmbeddingScore(target.target, score), None, None, None


@dataclass(frozen=True)
class MapSettings:
    """Everything but the image, the methods and the target that decides the maps."""

    block: int
    fill: str = "gray"
    head_fusion: str = "mean"
    discard_ratio: float = 0.0
    gradients: GradientOptions = GradientOptions()
    contrast: int | None = None


def method_maps(
    model: VitModel,
    prepared: PreparedImage,
    methods: Sequence[str],
    target_index: int | BoundTarget,
    settings: MapSettings,
    on_progress: Callable[[int], None] | None = None,
    clean_logits: Tensor | None = None,
) -> tuple[list[MethodMap], float | None]:
    """The maps of checked methods for a resolved target, and the hooked pass's self-check (None when none ran).

    The audits call this again on perturbed images and randomised models."""
    block, contrast = settings.block, settings.contrast
    needs_attention = bool(registry.ATTENTION_METHODS & set(methods))
    if needs_attention:
        require_attention(model)  # the explicit forward, or the family's captured attn.hook_pattern
    capture = None
    if needs_attention or "gradcam" in methods:
        capture = capture_gradients(
            model,
            prepared.input,
            target_index,
            attention=needs_attention,
            feature_block=block if "gradcam" in methods else None,
            backward=bool(registry.HOOKED_BACKWARD_METHODS & set(methods)),
            eval_logits=clean_logits,
            contrast=contrast,
        )
    grid = model.map_grid
    fill, head_fusion, discard_ratio = settings.fill, settings.head_fusion, settings.discard_ratio
    fusion = f"head fusion {head_fusion}, discard ratio {discard_ratio:g}"
    logit = "logit" if contrast is None else f"(logit - logit of class {contrast})"
    if isinstance(target_index, BoundTarget):
        logit = target_index.target.unit
    drop_unit, drop_definition = "drop (percentage points)", "100 x (clean - covered) target probability"
    if isinstance(target_index, BoundTarget):
        drop_unit, drop_definition = f"drop ({logit})", f"clean - covered {logit} ({target_index.target.short})"
    recipes = {
        "relevance": lambda: (
            relevance_map(grid, capture.attention, capture.attention_gradients),
            "relevance",
            f"Chefer et al. ICCV 2021: per block A-bar = mean over heads of (A * d {logit}/dA)^+, R = I, "
            "R += A-bar R; CLS row of R over the patches",
        ),
        "grad-rollout": lambda: (
            grad_rollout_map(grid, capture.attention, capture.attention_gradients, discard_ratio),
            "rollout",
            f"rollout of mean over heads of (A * d {logit}/dA), negatives set to 0; identity added, rows "
            f"renormalized, discard ratio {discard_ratio:g}; CLS row over the patches",
        ),
        "gradcam": lambda: (
            gradcam_map(grid, capture.features, capture.feature_gradients),
            "Grad-CAM",
            f"Grad-CAM at {gradcam_layer(model, block)[1]} (block {block}): ReLU(sum over channels of the patch-mean "
            f"gradient of the {logit} times the feature); prefix tokens dropped",
        ),
        "attention": lambda: (
            patch_map(grid, capture.attention[block - 1].double().mean(dim=0)[0]),
            "attention weight",
            f"block {block}: attention of the CLS query, mean over heads, patch sources (not renormalized)",
        ),
        "rollout": lambda: (
            patch_map(grid, attention_rollout(capture.attention, head_fusion, discard_ratio)[0]),
            "rollout",
            f"attention rollout (Abnar and Zuidema 2020), {fusion}: CLS row over the patches",
        ),
        "occlusion": lambda: (
            _occlusion_map(model, prepared, target_index, fill, on_progress),
            drop_unit,
            f"{drop_definition}, each patch alone covered with {fill} fill",
        ),
    }
    maps = []
    for method in methods:
        if method in registry.PIXEL_METHODS:
            values, attribution, unit, definition = pixel_attribution(
                model, prepared, method, target_index, contrast, settings.gradients, on_progress
            )
            maps.append(MethodMap(method, values, unit, definition, attribution))
        elif method in registry.BASELINE_METHODS:
            maps.append(MethodMap(method, *baseline_map(model, prepared, method, settings.gradients.seed)))
        elif method == "dla":
            decomposition = direct_decomposition(model, prepared, target_index, contrast)
            values = dla_map(model, decomposition)
            maps.append(MethodMap(method, values, logit, dla_definition(logit), decomposition=decomposition))
        else:
            maps.append(MethodMap(method, *recipes[method]()))
    return maps, capture.output_difference if capture is not None else None


def _occlusion_map(
    model: VitModel, prepared: PreparedImage, target: int | BoundTarget, fill: str, on_progress
) -> np.ndarray:
    size = model.map_grid.patch_size
    windows = SlidingWindows(model.map_grid, size, size)
    followed = target if isinstance(target, BoundTarget) else str(target)
    return occlude_patches(model, prepared, windows, followed, fill, on_progress).drop_grid.double().numpy()
