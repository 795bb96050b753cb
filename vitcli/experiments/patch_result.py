"""The result of `vitcli patch`: each image of the pair, each kind's scores, and how the two methods agree.

DENOMINATOR_TOLERANCE: below it, |M_clean - M_corrupt| is too small for the scores' ratio (the pair is refused).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vitcli.experiments.results import ClassScore
from vitcli.grid import PatchGrid
from vitcli.images import ImageSource
from vitcli.targets import EmbeddingTarget

DENOMINATOR_TOLERANCE = 1e-5


@dataclass
class ImageSide:
    source: ImageSource
    crop: np.ndarray  # (H, W, 3) uint8, for figures
    top: list[ClassScore]
    m: float  # logit(target) - logit(contrast) of this image


@dataclass
class KindScores:
    """The scores of one kind of site, shaped (blocks, tokens) for residual, (blocks,) for attention and mlp,
    (blocks, heads) for heads; None for a method not asked for."""

    kind: str
    activation: np.ndarray | None  # (M_patched - M_corrupt) / (M_clean - M_corrupt)
    attribution: np.ndarray | None  # the first-order estimate of the same score
    pearson: float | None  # between the two methods over this kind's sites (both asked, and both vary)
    spearman: float | None


@dataclass
class PatchResult:
    weights: str
    model_name: str
    grid: PatchGrid
    clean: ImageSide
    corrupt: ImageSide
    target: int | None  # None for an embedding target
    target_label: str
    target_rule: str
    contrast: int | None
    contrast_label: str
    contrast_rule: str
    methods: list[str]
    kinds: list[KindScores]
    patched_forwards: int  # one per site patched by activation (0 for attribution alone)
    pearson: float | None  # over every site of every kind
    spearman: float | None
    embedding: EmbeddingTarget | None = None  # the embedding target whose score is M

    @property
    def m_clean(self) -> float:
        return self.clean.m

    @property
    def m_corrupt(self) -> float:
        return self.corrupt.m


def correlations(
    activation: Sequence[np.ndarray | None], attribution: Sequence[np.ndarray | None]
) -> tuple[float | None, float | None]:
    """Pearson's and Spearman's correlation between the two methods' scores over the sites given; None unless both
    methods ran and both vary over at least two sites."""
    if any(scores is None for scores in [*activation, *attribution]):
        return None, None
    from scipy.stats import pearsonr, spearmanr

    first = np.concatenate([np.ravel(scores) for scores in activation])
    second = np.concatenate([np.ravel(scores) for scores in attribution])
    if first.size < 2 or np.ptp(first) == 0 or np.ptp(second) == 0:
        return None, None
    return float(pearsonr(first, second).statistic), float(spearmanr(first, second).statistic)
