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

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from vitcli.experiments.attention_summary import patch_distances
from vitcli.grid import PatchGrid

HSIC_MIN_EXAMPLES = 4  # the unbiased HSIC divides by (n - 3)


# ----- attention distance


def attention_distance(attention: np.ndarray | torch.Tensor, grid: PatchGrid) -> np.ndarray:
    """Mean attention distance in pixels of (..., N, N) attention over all N tokens (prefix first): (...,) values.

    Queries and sources are the patches only; the patch part of each row is not renormalized (module docstring).
    Computed in the attention's own precision (float32 from a model: about 1e-7 relative over a few hundred sources).
    """
    attention = torch.as_tensor(attention)
    distances = _token_distances(grid).to(dtype=attention.dtype, device=attention.device)
    total = attention.flatten(-2) @ distances
    return (total / grid.num_patches).cpu().double().numpy()


@functools.lru_cache(maxsize=8)
def _token_distances(grid: PatchGrid) -> torch.Tensor:
    """(N * N,) distances over all N tokens with 0 wherever a prefix token is the query or the source: one dot
    product per (image, head) then sums exactly the patch-to-patch terms, without copying the patch part of the
    attention. Kept per grid: a folder's every batch and block reads the same one."""
    tokens, first = grid.num_tokens, grid.num_prefix
    distances = torch.zeros(tokens, tokens, dtype=torch.float64)
    distances[first:, first:] = patch_distances(grid) * grid.patch_size  # attend's distances, in pixels
    return distances.flatten()


# ----- linear CKA


def gram(features: np.ndarray) -> np.ndarray:
    """(n, n) float64 linear kernel X X^T of (n, ...) features, each example flattened."""
    flat = np.asarray(features, dtype=np.float64).reshape(len(features), -1)
    return flat @ flat.T


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """The biased linear CKA of Kornblith et al. 2019 between (n, ...) features of the same n examples."""
    # ||Y^T X||_F^2 = <Xc Xc^T, Yc Yc^T>_F: the (n, n) Gram form, since the features may be wide (tokens x width).
    k, l = _centred_gram(x), _centred_gram(y)  # noqa: E741
    return float((k * l).sum() / (np.linalg.norm(k) * np.linalg.norm(l)))


def unbiased_hsic(k: np.ndarray, l: np.ndarray) -> float:  # noqa: E741  (the papers' name)
    """The unbiased HSIC estimator (Song et al. 2012) of two (n, n) kernel matrices, n >= 4."""
    n = len(k)
    if n < HSIC_MIN_EXAMPLES:
        raise ValueError(f"the unbiased HSIC needs at least {HSIC_MIN_EXAMPLES} examples, not {n}")
    k = np.array(k, dtype=np.float64)
    l = np.array(l, dtype=np.float64)  # noqa: E741
    np.fill_diagonal(k, 0)
    np.fill_diagonal(l, 0)
    ones_k, ones_l = k.sum(axis=0), l.sum(axis=0)
    trace = (k * l).sum()
    middle = ones_k.sum() * ones_l.sum() / ((n - 1) * (n - 2))
    last = 2 * (ones_k @ ones_l) / (n - 2)
    return float((trace + middle - last) / (n * (n - 3)))


def unbiased_linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA from unbiased HSIC over all n examples at once: the full estimator `MinibatchCka` converges to."""
    k, l = gram(x), gram(y)  # noqa: E741
    return float(unbiased_hsic(k, l) / np.sqrt(unbiased_hsic(k, k) * unbiased_hsic(l, l)))


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
        if len(grams) != self.layers:
            raise ValueError(f"expected {self.layers} Gram matrices, not {len(grams)}")
        for i in range(self.layers):
            for j in range(i, self.layers):
                value = unbiased_hsic(grams[i], grams[j])
                self.hsic_sums[i, j] += value
                if i != j:
                    self.hsic_sums[j, i] += value
        self.minibatches += 1
        self.examples += len(grams[0])

    def matrix(self) -> np.ndarray:
        """(L, L) CKA: sum of HSIC(K_i, K_j) / sqrt(sum HSIC(K_i, K_i) x sum HSIC(K_j, K_j))."""
        if not self.minibatches:
            raise ValueError("no minibatch was added")
        scale = np.sqrt(np.diag(self.hsic_sums))
        return self.hsic_sums / np.outer(scale, scale)


def _centred_gram(features: np.ndarray) -> np.ndarray:
    flat = np.asarray(features, dtype=np.float64).reshape(len(features), -1)
    centred = flat - flat.mean(axis=0)
    return centred @ centred.T


# ----- principal components


@dataclass
class Principal:
    components: np.ndarray  # (k, features) unit rows, the sign fixed so each row's largest |entry| is positive
    explained_variance_ratio: np.ndarray  # (k,)
    singular_values: np.ndarray  # (k,)
    mean: np.ndarray  # (features,) the mean subtracted before the decomposition


def principal_components(samples: np.ndarray, count: int) -> Principal:
    """The first `count` principal components of (n, features) samples, by SVD of the centred samples."""
    samples = np.asarray(samples, dtype=np.float64)
    mean = samples.mean(axis=0)
    centred = samples - mean
    _, singular, right = np.linalg.svd(centred, full_matrices=False)
    count = min(count, len(singular))
    axes = right[:count]
    largest = np.abs(axes).argmax(axis=1)
    axes = axes * np.sign(axes[np.arange(count), largest])[:, None]
    total = (singular**2).sum()
    ratio = singular[:count] ** 2 / total if total > 0 else np.zeros(count)
    return Principal(axes, ratio, singular[:count], mean)


class Moments:
    """The count, sum and sum of outer products of (n, features) samples fed in parts: their principal components
    without keeping the samples (float64, so the centring afterwards loses nothing that matters here)."""

    def __init__(self, features: int):
        self.count = 0
        self.total = np.zeros(features)
        self.outer = np.zeros((features, features))

    def add(self, samples: torch.Tensor) -> None:
        samples = samples.double()
        self.count += len(samples)
        self.total += samples.sum(dim=0).numpy()
        self.outer += (samples.T @ samples).numpy()

    def principal_components(self, count: int) -> Principal:
        """As `principal_components` of every sample fed: the eigenvectors of the covariance are the right singular
        vectors of the centred samples, its eigenvalues their squared singular values over n."""
        mean = self.total / self.count
        scatter = self.outer - self.count * np.outer(mean, mean)  # sum of (x - mean)(x - mean)^T
        values, vectors = np.linalg.eigh((scatter + scatter.T) / 2)
        values, vectors = np.clip(values[::-1], 0, None), vectors[:, ::-1].T  # largest first
        count = min(count, len(values))
        axes = vectors[:count]
        largest = np.abs(axes).argmax(axis=1)
        axes = axes * np.sign(axes[np.arange(count), largest])[:, None]
        total = values.sum()
        ratio = values[:count] / total if total > 0 else np.zeros(count)
        return Principal(axes, ratio, np.sqrt(values[:count]), mean)


def min_max(values: np.ndarray, axis: int | None = None) -> np.ndarray:
    """values scaled to [0, 1] over `axis` (a constant becomes 0)."""
    values = np.asarray(values, dtype=np.float64)
    low = values.min(axis=axis, keepdims=True)
    span = values.max(axis=axis, keepdims=True) - low
    return np.where(span > 0, (values - low) / np.where(span > 0, span, 1), 0.0)
