"""The gradient methods' one hooked pass and the maps made from it: relevance (Chefer et al.), grad-rollout and
Grad-CAM (vitcli.experiments.explain runs them with the other methods).

One forward and one backward of the target logit (not its probability) through the model's own modules: the capture
layer keeps the attention probabilities of every block (attn.hook_pattern: the fused attention is switched off for
that pass only, since it never forms them) and block B's ln1.hook_normalized, with their gradients. The logits of
that pass must equal the model's normal eval forward within OUTPUT_TOLERANCE; the capture carries the difference.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from vitcli.capture import block_site, caching_with_gradients, pattern_site
from vitcli.errors import VitcliError
from vitcli.experiments.attention import patch_map
from vitcli.experiments.rollout import attention_rollout
from vitcli.grid import PatchGrid
from vitcli.model import VitModel
from vitcli.targets import BoundTarget, output_of, score_of

OUTPUT_TOLERANCE = 1e-4  # largest |logits under the hooks - the model's own eval forward| allowed


# ----- the hooked forward and backward


@dataclass
class GradientCapture:
    """One image's hooked pass; tensors on the CPU, batch dimension removed."""

    logits: Tensor  # (classes,), or the pooled embedding (D,) for an embedding target
    attention: Tensor | None  # (blocks, heads, N, N) softmax(q k^T * scale)
    attention_gradients: Tensor | None  # d target logit / d attention, same shape
    features: Tensor | None  # (N, D) output of blocks[B-1].norm1
    feature_gradients: Tensor | None  # d target logit / d features
    output_difference: float  # max |logits - the model's own eval forward|


def capture_gradients(
    model: VitModel,
    image: Tensor,
    target: int | BoundTarget,
    attention: bool,
    feature_block: int | None,
    backward: bool = True,
    eval_logits: Tensor | None = None,
    contrast: int | None = None,
) -> GradientCapture:
    """Run one (3, H, W) normalized image through the model with hooks; backward from the target logit (minus the
    contrast class's logit, when given), or from an embedding target's score of the pooled embedding.

    eval_logits: the model's eval forward of the image, when already computed (else it runs here; always for an
    embedding target, whose forward ends at the pooled embedding).
    """
    net = model.net
    attention_sites = [pattern_site(number) for number in range(1, model.depth + 1)] if attention else []
    feature_sites = [block_site(feature_block, gradcam_site(model))] if feature_block is not None else []
    dtype = next(net.parameters()).dtype
    # A copy that requires grad: the graph reaches the input whatever the parameters' flags, and autograd.grad to
    # it leaves the parameters' .grad untouched.
    inputs = image[None].to(model.device, dtype).clone().requires_grad_(True)
    output = output_of(model, target)
    with torch.enable_grad(), caching_with_gradients(net, attention_sites + feature_sites) as kept, output:
        logits = net(inputs)[0]
        if backward:
            torch.autograd.grad(score_of(logits[None], target, contrast)[0], inputs)
    missing = set(attention_sites + feature_sites) - set(kept.activations)
    if backward:
        missing |= set(attention_sites + feature_sites) - set(kept.gradients)
    if missing:
        raise VitcliError(f"cannot explain with {model.name}: a captured site gave no activation or gradient")
    if eval_logits is None or isinstance(target, BoundTarget):
        with output_of(model, target):
            eval_logits = model.logits(inputs.detach())[0]
    own = eval_logits.float().cpu()
    difference = float((logits.detach().float().cpu() - own).abs().max())
    if not difference <= OUTPUT_TOLERANCE:
        raise VitcliError(
            f"self-check failed: the hooked forward's logits differ from the model's eval forward by {difference:.3g} "
            f"(tolerance {OUTPUT_TOLERANCE:g}); no results"
        )
    features = _unbatched([kept.activations[site] for site in feature_sites])
    feature_gradients = _unbatched([kept.gradients.get(site) for site in feature_sites])
    return GradientCapture(
        logits.detach().cpu(),
        _unbatched([kept.activations[site] for site in attention_sites]),
        _unbatched([kept.gradients.get(site) for site in attention_sites]),
        features[0] if features is not None else None,
        feature_gradients[0] if feature_gradients is not None else None,
        difference,
    )


def gradcam_site(model: VitModel) -> str:
    """The block site Grad-CAM reads: ln1's output on one-grid families, ln2's on Swin (see gradcam_layer)."""
    return "ln1.hook_normalized" if "plain_rows" in model.family.features else "ln2.hook_normalized"


def gradcam_layer(model: VitModel, block: int) -> tuple[nn.Module, str]:
    """The module whose output Grad-CAM reads in a one-based block, and its name: pytorch-grad-cam's documented
    recipes, norm1 for ViTs (blocks[-1].norm1) and norm2 for Swin (layers[-1].blocks[-1].norm2), whose norm2 reads
    the rows in grid order (its norm1 keeps them as (H, W) rows); found by the family's tap of that site."""
    family = model.family
    layer = family.block_tap(family.blocks()[block - 1], family.places()[block - 1], gradcam_site(model)).module
    name = next(name for name, found in model.net.named_modules() if found is layer)
    return layer, re.sub(r"\.([0-9]+)", r"[\1]", name)  # blocks.11.norm1 -> blocks[11].norm1


def _unbatched(tensors: list[Tensor | None]) -> Tensor | None:
    """The captured (1, ...) tensors stacked without their batch dimension, on the CPU; None if none were kept."""
    if not tensors or any(tensor is None for tensor in tensors):
        return None
    return torch.stack([tensor[0].cpu() for tensor in tensors])


# ----- the maps, from captured tensors


def relevance_map(grid: PatchGrid, attention: Tensor, gradients: Tensor) -> np.ndarray:
    """Chefer, Gur and Wolf (ICCV 2021), eq. 5-6: A-bar = mean over heads of (dy/dA * A)^+; R = I; R += A-bar R."""
    attention, gradients = attention.double(), gradients.double()
    relevance = torch.eye(attention.shape[-1], dtype=torch.float64)
    for block_attention, block_gradients in zip(attention, gradients, strict=True):
        weighted = (block_gradients * block_attention).clamp(min=0).mean(dim=0)
        relevance = relevance + weighted @ relevance
    return patch_map(grid, relevance[0].double())


def grad_rollout_map(grid: PatchGrid, attention: Tensor, gradients: Tensor, discard_ratio: float) -> np.ndarray:
    """vit-explain's gradient rollout: heads weighted by their gradient, averaged, negatives set to 0, then rollout."""
    fused = (gradients.double() * attention.double()).mean(dim=1).clamp(min=0)
    return patch_map(grid, attention_rollout(fused[:, None], "mean", discard_ratio)[0])


def gradcam_map(grid: PatchGrid, features: Tensor, gradients: Tensor) -> np.ndarray:
    """ReLU(sum over channels of (mean over patches of the gradient) * feature), on the patch tokens only."""
    patches = features[grid.num_prefix :].double()
    weights = gradients[grid.num_prefix :].double().mean(dim=0)
    return (patches @ weights).clamp(min=0).reshape(grid.rows, grid.cols).numpy()
