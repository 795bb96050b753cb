"""The checkpoint itself at other patch sizes: resampled (FlexiViT pseudo-inverse, as timm does), not retrained."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path

import timm
import torch
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor

from vitcli.experiments.patch_size_variants import Variant, pad_to_patches
from vitcli.images import ImageSource, load_rgb
from vitcli.model import PreparedImage, VitModel

ADAPTED_NOTE = "adapted, not retrained"


@dataclass(frozen=True)
class AdaptedPrediction:
    top1_index: int
    top1_label: str
    top1_probability: float
    native_top1_probability: float  # probability of the class the unmodified checkpoint ranks first


@dataclass(frozen=True)
class AdaptedRun:
    image: ImageSource
    native_top1_index: int  # the unmodified checkpoint's top-1 class at its own patch and image size
    native_top1_label: str
    # max |logit difference| between the checkpoint adapted to its own patch size and itself; NaN when not run
    native_logit_difference: float
    predictions: dict[int, AdaptedPrediction]  # by patch size


def adapt_net(net: VisionTransformer, variant: Variant) -> VisionTransformer:
    """A copy of the checkpoint at this patch size: timm's set_input_size resamples the patch-embedding kernel
    with the FlexiViT pseudo-inverse (resample_patch_embed) and the position embeddings to the new grid
    (resample_abs_pos_embed, bicubic). The shared network is never modified."""
    adapted = copy.deepcopy(net)
    adapted.set_input_size(
        img_size=(variant.padded_size, variant.padded_size), patch_size=(variant.patch_size, variant.patch_size)
    )
    return adapted.eval()


def resized_input(model: VitModel, path: Path, image_size: int) -> Tensor:
    """The image through the checkpoint's eval transform at another size (its own crop fraction kept)."""
    config = {**model.data_config, "input_size": (3, image_size, image_size)}
    transform = timm.data.create_transform(**config, is_training=False)
    image, _ = load_rgb(path)
    return transform(image)


def adapt_and_predict(model: VitModel, variants: list[Variant], prepared: PreparedImage) -> AdaptedRun:
    """Each variant's prediction with the adapted checkpoint, and the largest |logit difference| between the
    checkpoint adapted to its own patch size and the checkpoint itself (should be 0)."""
    image_size = variants[0].image_size
    if image_size == model.data_config["input_size"][-1]:
        image = prepared.input
    else:
        image = resized_input(model, prepared.source.path, image_size)
    reference = model.logits(prepared.input[None])[0]
    native_top1 = int(reference.argmax())
    predictions: dict[int, AdaptedPrediction] = {}
    native_difference = math.nan
    for variant in variants:
        adapted = adapt_net(model.net, variant)
        with torch.inference_mode():
            logits = adapted(pad_to_patches(image[None], variant.patch_size).to(model.device)).float().cpu()[0]
        probabilities = logits.softmax(dim=-1)
        top1 = int(probabilities.argmax())
        predictions[variant.patch_size] = AdaptedPrediction(
            top1, model.labels[top1], float(probabilities[top1]), float(probabilities[native_top1])
        )
        dimensions = variant.dimensions
        if variant.patch_size == dimensions.native_patch and variant.image_size == dimensions.native_image:
            native_difference = float((logits - reference).abs().max())
    return AdaptedRun(prepared.source, native_top1, model.labels[native_top1], native_difference, predictions)
