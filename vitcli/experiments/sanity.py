"""Sanity checks for saliency maps (Adebayo et al., NeurIPS 2018): does the map depend on the model's weights?

Model-parameter randomisation re-initialises modules with the initialiser timm gives a fresh model of this
architecture (timm's `get_init_weights_vit` for the model's weight-init mode, after each module's own
reset_parameters; position embedding trunc_normal(0.02), class and register tokens normal(1e-6)), then recomputes
every map for the same target class:

- cascading: step k randomises blocks depth..depth-k+1 (the last first); the final step adds the patch embedding,
  position embedding, class token and register tokens (those the model has, each listed by its name in the net)
  together: depth + 1 steps;
- independent: one block at a time, every other module original: depth steps.

Each module's random weights come from a generator seeded with (seed, module name), so block b gets the same random
weights in both kinds. The weights are restored afterwards (also after an error). The random-logit test compares the
map for the target with the map for a random other class (drawn from the seed) on the original model.

Similarity with the original map: Spearman rank correlation of |map| ("absolute") and of the map ("signed"), and
SSIM of the min-max scaled |map| (Wang et al. 2004 with scikit-image's defaults: a uniform window of 7, or the largest
odd size that fits the grid, K1 0.01, K2 0.03, sample covariance, borders cropped). Identical maps have similarity
exactly 1. A method passes when its absolute Spearman correlation is below the threshold once every block is
randomised (cascading step depth).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from vitcli.model import VitModel

SSIM_WINDOW = 7


@dataclass(frozen=True)
class Similarity:
    spearman_abs: float
    spearman_signed: float
    ssim: float


@dataclass
class SanityStep:
    kind: str  # "original", "cascading" or "independent"
    name: str  # e.g. "blocks 12..10"
    modules: list[str]  # every module randomised at this step, by its name in the net
    maps: dict[str, np.ndarray]  # method -> (rows, cols)
    similarity: dict[str, Similarity]  # method -> similarity with the original map


@dataclass
class Sanity:
    seed: int
    threshold: float
    steps: list[SanityStep]  # the original first, then the cascading steps, then the independent ones
    random_class: int  # the random-logit test's class
    random_logit_maps: dict[str, np.ndarray]
    random_logit: dict[str, Similarity]

    def passed(self, method: str) -> bool:
        """Whether the map's absolute Spearman correlation fell below the threshold with every block randomised."""
        last_block = [step for step in self.steps if step.kind == "cascading"][-2]
        return last_block.similarity[method].spearman_abs < self.threshold


# ----- similarity


def spearman(first: np.ndarray, second: np.ndarray) -> float:
    from scipy.stats import spearmanr

    if np.array_equal(first, second):
        return 1.0
    return float(spearmanr(first.reshape(-1), second.reshape(-1)).statistic)


def ssim(first: np.ndarray, second: np.ndarray) -> float:
    """SSIM of two maps scaled to [0, 1] each (data range 1), computed as scikit-image's structural_similarity."""
    from scipy.ndimage import uniform_filter

    if np.array_equal(first, second):
        return 1.0
    window = min(SSIM_WINDOW, *(size if size % 2 else size - 1 for size in first.shape))
    a, b = _unit(first), _unit(second)
    count = window**first.ndim
    covariance_norm = count / (count - 1)

    def mean(values: np.ndarray) -> np.ndarray:
        return uniform_filter(values, size=window)

    mean_a, mean_b = mean(a), mean(b)
    var_a = covariance_norm * (mean(a * a) - mean_a * mean_a)
    var_b = covariance_norm * (mean(b * b) - mean_b * mean_b)
    cov = covariance_norm * (mean(a * b) - mean_a * mean_b)
    c1, c2 = 0.01**2, 0.03**2
    index = ((2 * mean_a * mean_b + c1) * (2 * cov + c2)) / ((mean_a**2 + mean_b**2 + c1) * (var_a + var_b + c2))
    pad = (window - 1) // 2
    return float(index[pad : index.shape[0] - pad, pad : index.shape[1] - pad].mean())


def _unit(values: np.ndarray) -> np.ndarray:
    magnitude = np.abs(np.nan_to_num(values.astype(np.float64)))
    low, high = magnitude.min(), magnitude.max()
    return (magnitude - low) / (high - low) if high > low else np.zeros_like(magnitude)


def similarity(original: np.ndarray, other: np.ndarray) -> Similarity:
    return Similarity(spearman(np.abs(original), np.abs(other)), spearman(original, other), ssim(original, other))


# ----- randomisation


def module_seed(seed: int, name: str) -> int:
    return zlib.crc32(f"{seed}:{name}".encode())


TOKENS = ("cls_token", "reg_token")  # prefix tokens, initialised normal(1e-6) as timm does


def randomise(net: nn.Module, name: str, seed: int) -> None:
    """Re-initialise net's module or parameter `name` ("blocks.11", "patch_embed", "pos_embed", "cls_token",
    "reg_token") with timm's fresh-model initialiser, from a generator seeded with (seed, name)."""
    from timm.layers import trunc_normal_
    from timm.models import named_apply
    from timm.models.vision_transformer import get_init_weights_vit

    initialise = get_init_weights_vit(getattr(net, "weight_init_mode", ""), needs_reset=True)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(module_seed(seed, name))
        if name == "pos_embed":
            trunc_normal_(net.pos_embed, std=0.02)
        elif name in TOKENS:
            nn.init.normal_(getattr(net, name), std=1e-6)
        else:
            named_apply(initialise, net.get_submodule(name), name=name, include_root=True)


def embedding_modules(net: nn.Module) -> list[str]:
    """What the last cascading step randomises besides the blocks: the patch embedding and whichever of the position
    embedding and the prefix tokens this model has."""
    present = [name for name in ("pos_embed", *TOKENS) if getattr(net, name, None) is not None]
    return ["patch_embed", *present]


def schedule(depth: int, embeddings: list[str]) -> list[tuple[str, str, list[str]]]:
    """(kind, step name, modules randomised) for the cascading and the independent steps."""
    steps = []
    for count in range(1, depth + 1):
        blocks = [f"blocks.{index}" for index in range(depth - 1, depth - count - 1, -1)]
        name = f"block {depth}" if count == 1 else f"blocks {depth}..{depth - count + 1}"
        steps.append(("cascading", name, blocks))
    blocks = [f"blocks.{index}" for index in range(depth - 1, -1, -1)]
    steps.append(("cascading", f"blocks {depth}..1 + embeddings", [*blocks, *embeddings]))
    steps += [("independent", f"block {index + 1} alone", [f"blocks.{index}"]) for index in range(depth)]
    return steps


def randomised_models(model: VitModel, seed: int) -> Iterator[tuple[str, str, list[str]]]:
    """Put the model through every step of schedule() in place, yielding each step while it holds; the original
    weights are restored between the kinds and at the end (also when the caller stops early or fails)."""
    net = model.net
    original = {name: tensor.detach().clone() for name, tensor in net.state_dict().items()}
    try:
        done: set[str] = set()
        for kind, name, modules in schedule(model.depth, embedding_modules(net)):
            if kind == "independent" or not set(modules) >= done:
                net.load_state_dict(original)
                done = set()
            for module in modules:
                if module not in done:
                    randomise(net, module, seed)
                    done.add(module)
            yield kind, name, modules
    finally:
        net.load_state_dict(original)


def count_steps(depth: int) -> int:
    """Map recomputations: depth + 1 cascading, depth independent, one random-logit."""
    return 2 * depth + 2


def sanity(
    model: VitModel,
    compute: Callable[[int], dict[str, np.ndarray]],
    original: dict[str, np.ndarray],
    target: int,
    seed: int,
    threshold: float,
    on_step: Callable[[int], None] | None = None,
) -> Sanity:
    """compute(class) gives every method's (rows, cols) map for a class on the model as it stands; original holds
    the maps of the unchanged model for the target."""
    steps = [SanityStep("original", "original", [], dict(original), {m: similarity(v, v) for m, v in original.items()})]
    for kind, name, modules in randomised_models(model, seed):
        maps = compute(target)
        scores = {method: similarity(original[method], maps[method]) for method in original}
        steps.append(SanityStep(kind, name, modules, maps, scores))
        if on_step is not None:
            on_step(1)
    random_class = random_other_class(model.num_classes, target, seed)
    other = compute(random_class)
    if on_step is not None:
        on_step(1)
    scores = {method: similarity(original[method], other[method]) for method in original}
    return Sanity(seed, threshold, steps, random_class, other, scores)


def random_other_class(classes: int, target: int, seed: int) -> int:
    drawn = int(torch.randint(classes - 1, (1,), generator=torch.Generator().manual_seed(seed)))
    return drawn + (drawn >= target)


def similarity_table(result: Sanity, methods: Sequence[str]) -> list[tuple[str, str, str, Similarity]]:
    """(kind, step, method, similarity) in order, the random-logit test last."""
    rows = [(step.kind, step.name, method, step.similarity[method]) for step in result.steps for method in methods]
    rows += [
        ("random logit", f"class {result.random_class}", method, result.random_logit[method]) for method in methods
    ]
    return rows
