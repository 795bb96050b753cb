"""The results of `vitcli anatomy`'s image views and the constants that describe them (`anatomy_images` computes
them and re-exports every name here).

Blocks count from 1 in every result, as everywhere in vitcli; arrays indexed by block put block b at index b - 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from vitcli.grid import PatchGrid
from vitcli.images import ImageSource

IMAGE_VIEWS = ("distance", "cka", "pca", "norms")
ATTENTION_VIEWS = frozenset({"distance", "norms"})  # the views that need attention probabilities
CKA_MIN_IMAGES = 4  # the unbiased HSIC needs at least 4 examples (anatomy_math.HSIC_MIN_EXAMPLES)
DEFAULT_CKA_MINIBATCH = 32
DEFAULT_PCA_THRESHOLD = 0.5
DEFAULT_NORM_FACTOR = 3.0

DISTANCE_NOTE = (
    "mean over query patches and images of the sum over source patches of attention x the pixel distance between "
    "patch centres; prefix tokens are neither queries nor sources, and the attention over patches is not "
    "renormalized (attention to prefix tokens counts as distance 0)"
)
CKA_EXAMPLE = "one image: the rows leaving the block, every token (prefix tokens included), flattened"
PCA_FEATURES = "patch rows of the last block's output after the model's final norm (prefix tokens excluded)"
NORMS_NOTE = (
    "L2 norm of every token's row leaving each block; an outlier exceeds factor x the median over the folder's "
    "tokens in that block; cls_attention is the class token's attention to it in that block, mean over heads"
)


@dataclass
class DistanceResult:
    grid: PatchGrid
    mean: np.ndarray  # (blocks, heads) pixels, averaged over images
    per_image: np.ndarray  # (images, blocks, heads) pixels
    sources: list[ImageSource]
    renormalized: bool  # False: attention over patch sources is used as computed (see DISTANCE_NOTE)
    note: str
    weights: str = ""  # the weights' label, e.g. "RANDOM (seed 0)" (measure() fills it)
    skipped: list[str] = field(default_factory=list)  # one line per image that could not be read (left out)


@dataclass
class CkaResult:
    matrix: np.ndarray  # (blocks, blocks) linear CKA between the rows leaving block i + 1 and block j + 1
    estimator: str  # e.g. "minibatch unbiased HSIC (Nguyen et al. 2021), 3 minibatches of 32 images"
    example: str  # what one example is (CKA_EXAMPLE)
    images: int  # images fed
    used: int  # images in the estimate (a last minibatch with fewer than CKA_MIN_IMAGES images is left out)
    minibatch: int
    minibatches: int
    weights: str = ""
    skipped: list[str] = field(default_factory=list)


@dataclass
class PcaResult:
    grid: PatchGrid
    rgb: np.ndarray  # (images, rows, cols, 3) in [0, 1]: components 1-3 min-max scaled over the folder
    first: np.ndarray  # (images, rows, cols) component 1 min-max scaled over the folder (the red channel)
    mask: np.ndarray  # (images, rows, cols) bool: first > threshold (foreground)
    threshold: float
    components: np.ndarray  # (3, width) unit principal axes (sign: largest |entry| positive)
    explained_variance_ratio: np.ndarray  # (3,)
    sources: list[ImageSource]
    features: str  # which rows were decomposed (PCA_FEATURES)
    weights: str = ""
    skipped: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class NormOutlier:
    image: int  # zero-based index into NormsResult.sources
    token: int  # zero-based token index (prefix tokens first)
    name: str  # "P74", "CLS", "R2"
    block: int  # one-based
    norm: float
    median: float  # the block's median norm over the folder
    cls_attention: float | None  # the class token's attention to it in that block (mean over heads); None without


@dataclass
class NormsResult:
    grid: PatchGrid
    norms: np.ndarray  # (images, blocks, tokens) float32
    medians: np.ndarray  # (blocks,) median over every image's tokens
    factor: float
    outliers: list[NormOutlier]  # by image, block, then token
    sources: list[ImageSource]
    note: str
    weights: str = ""
    skipped: list[str] = field(default_factory=list)

    @property
    def token_names(self) -> list[str]:
        return [self.grid.token_name(token) for token in range(self.grid.num_tokens)]


@dataclass
class ImageAnatomy:
    """The image views asked for (None: not asked)."""

    sources: list[ImageSource]
    distance: DistanceResult | None = None
    cka: CkaResult | None = None
    pca: PcaResult | None = None
    norms: NormsResult | None = None
