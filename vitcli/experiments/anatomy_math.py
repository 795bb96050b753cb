"""The arithmetic of `vitcli anatomy`, on plain arrays: attention distance, linear CKA and PCA.

Kept apart from the model so that tests can hold each formula to constructed inputs and to direct numpy versions.

Attention distance (ViT paper, Figure 7 right; Raghu et al. 2021): for a query patch q, the sum over source patches s
of attention[q, s] x the pixel distance between the centres of q and s, averaged over query patches. Prefix tokens
(CLS, DIST, registers) are neither queries nor sources, and the attention over patch sources is NOT renormalized: the
share a query gives to prefix tokens counts as distance 0 (it pulls the mean down), as in the reference code.

Linear CKA (Kornblith et al. 2019): for features X (n, p) and Y (n, q) of the same n examples,
    CKA = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)),  K = X X^T, L = Y Y^T.
`linear_cka` is the usual biased estimator (centred features: ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F));
`unbiased_linear_cka` uses the unbiased HSIC of Song et al. 2012; `MinibatchCka` is the minibatch estimator of
Nguyen et al. 2021: unbiased HSIC per minibatch, summed per pair of layers, the ratio taken at the end. It keeps
only layers x layers sums, never activations. On one minibatch holding every example it equals `unbiased_linear_cka`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vitcli.grid import PatchGrid

HSIC_MIN_EXAMPLES = 4  # the unbiased HSIC divides by (n - 3)


# ----- attention distance


def patch_centres(grid: PatchGrid) -> np.ndarray:
    """(patches, 2) pixel coordinates (y, x) of every patch's centre, P1 first, in crop pixels."""
    raise NotImplementedError


def patch_distances(grid: PatchGrid) -> np.ndarray:
    """(patches, patches) Euclidean distance in pixels between patch centres."""
    raise NotImplementedError


def attention_distance(attention: np.ndarray, grid: PatchGrid) -> np.ndarray:
    """Mean attention distance in pixels of (..., N, N) attention over all N tokens (prefix first): (...,) values.

    Queries and sources are the patches only; the patch part of each row is not renormalized (module docstring)."""
    raise NotImplementedError


# ----- linear CKA


def gram(features: np.ndarray) -> np.ndarray:
    """(n, n) float64 linear kernel X X^T of (n, ...) features, each example flattened."""
    raise NotImplementedError


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """The biased linear CKA of Kornblith et al. 2019 between (n, ...) features of the same n examples."""
    raise NotImplementedError


def unbiased_hsic(k: np.ndarray, l: np.ndarray) -> float:  # noqa: E741  (the papers' name)
    """The unbiased HSIC estimator (Song et al. 2012) of two (n, n) kernel matrices, n >= 4."""
    raise NotImplementedError


def unbiased_linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA from unbiased HSIC over all n examples at once: the full estimator `MinibatchCka` converges to."""
    raise NotImplementedError


class MinibatchCka:
    """Nguyen et al.'s minibatch CKA between every pair of L layers: feed minibatches, then `matrix()`.

    Each minibatch must hold at least HSIC_MIN_EXAMPLES examples; memory is O(L^2) whatever the number of examples.
    """

    def __init__(self, layers: int):
        self.layers = layers
        self.hsic_sums = np.zeros((layers, layers))
        self.minibatches = 0
        self.examples = 0

    def add(self, grams: Sequence[np.ndarray]) -> None:
        """One minibatch: the (m, m) Gram matrix of each layer, over the same m examples."""
        raise NotImplementedError

    def matrix(self) -> np.ndarray:
        """(L, L) CKA: sum of HSIC(K_i, K_j) / sqrt(sum HSIC(K_i, K_i) x sum HSIC(K_j, K_j))."""
        raise NotImplementedError


# ----- principal components


@dataclass
class Principal:
    components: np.ndarray  # (k, features) unit rows, the sign fixed so each row's largest |entry| is positive
    explained_variance_ratio: np.ndarray  # (k,)
    singular_values: np.ndarray  # (k,)
    mean: np.ndarray  # (features,) the mean subtracted before the decomposition


def principal_components(samples: np.ndarray, count: int) -> Principal:
    """The first `count` principal components of (n, features) samples, by SVD of the centred samples."""
    raise NotImplementedError


def min_max(values: np.ndarray, axis: int | None = None) -> np.ndarray:
    """values scaled to [0, 1] over `axis` (a constant becomes 0)."""
    raise NotImplementedError
