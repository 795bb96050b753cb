"""Input-gradient maps: Integrated Gradients, SmoothGrad and gradient x input, summed per patch.

Each differentiates the score s(x) = logit(target) - logit(contrast) (the logit alone without a contrast class), or
an embedding target's score of the pooled embedding (vitcli.targets), with respect to the normalized input pixels,
through the model's own (fused) forward, `model.batch_size` copies per backward.
The pixel attribution (3, H, W) is kept; its patch map is the sum of |attribution| over the patch's pixels
and channels, and the signed sum is kept beside it.

- Integrated Gradients (Sundararajan, Taly and Yan, ICML 2017) exactly as captum's `IntegratedGradients` with
  method="riemann_trapezoid": alphas linspace(0, 1, n), weights 1/n with both ends halved (they sum to 1 - 1/n),
  attribution = (x - baseline) * sum_i w_i grad s(baseline + alpha_i (x - baseline)).
- SmoothGrad (Smilkov et al. 2017): the mean gradient over `samples` copies x + N(0, sigma^2), sigma = noise x
  (max - min of the normalized input), drawn from a seeded generator.
- gradient x input (Shrikumar et al. 2016): x * grad s(x).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from vitcli.experiments.explain_options import GradientOptions
from vitcli.grid import PatchGrid
from vitcli.model import PreparedImage, VitModel
from vitcli.targets import BoundTarget, output_of, score_of


@dataclass
class Completeness:
    """IG's self-check: the attributions sum to (weight total) x (s(x) - s(baseline)) up to the Riemann error."""

    attribution_sum: float
    score: float  # s(x)
    baseline_score: float  # s(baseline)
    weight_total: float  # sum of the Riemann weights: 1 - 1/n with captum's trapezoid

    @property
    def relative_error(self) -> float:
        expected = self.weight_total * (self.score - self.baseline_score)
        return abs(self.attribution_sum - expected) / max(abs(expected), 1e-12)


@dataclass
class PixelAttribution:
    pixels: np.ndarray  # (3, H, W) float32 attribution of each normalized input value
    signed: np.ndarray  # (rows, cols) float64: signed sum per patch
    completeness: Completeness | None = None  # IG only


def count_backwards(methods: list[str], options: GradientOptions) -> int:
    """Forward-and-backward passes of one input the pixel methods run (for the docs' cost and progress)."""
    cost = {"ig": options.ig_steps, "smoothgrad": options.samples, "gradient": 1}
    return sum(cost[method] for method in methods if method in cost)


def scores_and_gradients(
    model: VitModel, inputs: Tensor, target: int | BoundTarget, contrast: int | None, on_progress=None
) -> tuple[Tensor, Tensor]:
    """s and ds/dx for each of (B, 3, H, W) normalized inputs, `model.batch_size` at a time; CPU float32."""
    net = model.net
    dtype = next(net.parameters()).dtype
    scores, gradients = [], []
    for chunk in inputs.split(model.batch_size):
        copy = chunk.to(model.device, dtype).clone().requires_grad_(True)
        with torch.enable_grad(), output_of(model, target):
            score = score_of(net(copy), target, contrast)
            # Each image's score depends on its own input alone (eval mode), so the gradient of the sum is each's.
            (gradient,) = torch.autograd.grad(score.sum(), copy)
        scores.append(score.detach().float().cpu())
        gradients.append(gradient.float().cpu())
        if on_progress is not None:
            on_progress(len(chunk))
    return torch.cat(scores), torch.cat(gradients)


def patch_sums(grid: PatchGrid, pixels: Tensor) -> np.ndarray:
    """(rows, cols) float64: the sum of a (3, H, W) attribution over each patch's pixels and channels."""
    size = grid.patch_size
    inside = pixels[:, : grid.rows * size, : grid.cols * size].double()
    return inside.reshape(3, grid.rows, size, grid.cols, size).sum(dim=(0, 2, 4)).numpy()


def riemann_trapezoid(steps: int) -> tuple[list[float], list[float]]:
    """captum's riemann_trapezoid (alphas, weights): linspace(0, 1, n) and 1/n each, halved at both ends."""
    weights = [1 / steps] * steps
    weights[0] /= 2
    weights[-1] /= 2
    return torch.linspace(0, 1, steps).tolist(), weights


def integrated_gradients(
    model: VitModel,
    image: Tensor,
    baseline: Tensor,
    target: int | BoundTarget,
    contrast: int | None,
    steps: int,
    on_progress=None,
) -> tuple[Tensor, Completeness]:
    alphas, weights = riemann_trapezoid(steps)
    difference = image - baseline
    path = torch.stack([baseline + alpha * difference for alpha in alphas])
    scores, gradients = scores_and_gradients(model, path, target, contrast, on_progress)
    total = (gradients.reshape(steps, -1) * torch.tensor(weights).reshape(steps, 1)).sum(dim=0)
    attribution = total.reshape(image.shape) * difference
    # The path's ends are x and the baseline themselves: their scores come with the gradients.
    check = Completeness(float(attribution.double().sum()), float(scores[-1]), float(scores[0]), float(sum(weights)))
    return attribution, check


def smoothgrad(
    model: VitModel,
    image: Tensor,
    target: int | BoundTarget,
    contrast: int | None,
    options: GradientOptions,
    on_progress=None,
) -> Tensor:
    sigma = options.noise * float(image.max() - image.min())
    generator = torch.Generator().manual_seed(options.seed)
    noise = torch.randn((options.samples, *image.shape), generator=generator) * sigma
    _, gradients = scores_and_gradients(model, image + noise, target, contrast, on_progress)
    return gradients.mean(dim=0)


def pixel_attribution(
    model: VitModel,
    prepared: PreparedImage,
    method: str,
    target: int | BoundTarget,
    contrast: int | None,
    options: GradientOptions,
    on_progress=None,
) -> tuple[np.ndarray, PixelAttribution, str, str]:
    """(patch map of sum |attribution|, the attribution, unit, definition) of one pixel method."""
    from vitcli.experiments.occlusion import fill_image

    image = prepared.input
    score = "logit(target)" if contrast is None else f"logit(target) - logit({contrast})"
    if isinstance(target, BoundTarget):
        score = f"the {target.target.unit} ({target.target.short})"
    completeness = None
    if method == "ig":
        baseline = fill_image(model, prepared, options.baseline)
        pixels, completeness = integrated_gradients(
            model, image, baseline, target, contrast, options.ig_steps, on_progress
        )
        definition = (
            f"Integrated Gradients of {score}, {options.baseline} baseline, {options.ig_steps} steps, captum's "
            "riemann_trapezoid (alphas linspace(0, 1, n), weights 1/n halved at both ends)"
        )
    elif method == "smoothgrad":
        pixels = smoothgrad(model, image, target, contrast, options, on_progress)
        definition = (
            f"SmoothGrad of {score}: mean gradient over {options.samples} copies with Gaussian noise, sigma "
            f"{options.noise:g} x the normalized input's range, seed {options.seed}"
        )
    elif method == "gradient":
        _, gradients = scores_and_gradients(model, image[None], target, contrast, on_progress)
        pixels = gradients[0] * image
        definition = f"gradient x input of {score}"
    else:
        raise ValueError(f"not a pixel method: {method}")
    attribution = PixelAttribution(pixels.numpy(), patch_sums(model.map_grid, pixels), completeness)
    definition += "; per patch: sum of |attribution| over the patch's pixels and channels (signed sum kept)"
    return patch_sums(model.map_grid, pixels.abs()), attribution, "sum |attribution| per patch", definition
