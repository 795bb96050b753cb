"""What a ViT learned about space, read from its weights alone (the ViT paper's Figure 7, left and middle).

`filters`: the principal components of the patch-embedding filters. Each of the D filters is one column of W_E (one
row of the Conv2d kernel): 3 p^2 values, channel-major (all R of the patch, then G, then B). The D filters are the
samples; they are centred (the mean filter subtracted) and the components are the right singular vectors of that
(D, 3 p^2) matrix, reshaped to (3, p, p) RGB patches.

`positions`: the cosine similarity of every patch's position embedding with every other patch's. Prefix tokens
(CLS, DIST, registers) are left out: the map is over patches P1..PN only, whether or not the model gives the prefix
tokens position embeddings of their own. Models without learned (or fixed) absolute position embeddings get a reason
instead of numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vitcli.grid import PatchGrid
from vitcli.model import VitModel

DEFAULT_COMPONENTS = 28  # the ViT paper's Figure 7 (left) shows the first 28


@dataclass
class FiltersResult:
    components: np.ndarray  # (k, 3, p, p) float64: principal component i as an RGB patch, unit length over 3 p^2 values
    explained_variance_ratio: np.ndarray  # (k,) each component's share of the centred filters' variance; sums <= 1
    singular_values: np.ndarray  # (k,) of the centred (filters, 3 p^2) matrix
    filters: int  # D: how many filters (samples) the components summarise
    patch_size: int  # p
    weights: str  # the weights' label, e.g. "RANDOM (seed 0)"

    @property
    def values_per_filter(self) -> int:
        return 3 * self.patch_size**2


@dataclass
class PositionsResult:
    grid: PatchGrid
    similarity: np.ndarray | None  # (patches, patches) float64 cosine similarity; entry [i, j] is P(i+1) vs P(j+1)
    reason: str | None  # one line when `similarity` is None (no learned absolute position embeddings)
    prefix: str  # how the prefix tokens were handled, one line
    fixed: bool  # True when the embedding is a fixed (non-trained) table, e.g. sine-cosine
    weights: str

    def patch_map(self, patch: int) -> np.ndarray:
        """Patch Pn's similarity with every patch as a (rows, cols) map: one small map of the paper's grid."""
        if self.similarity is None:
            raise ValueError(self.reason)
        return self.similarity[patch - 1].reshape(self.grid.rows, self.grid.cols)


def filters(model: VitModel, components: int = DEFAULT_COMPONENTS) -> FiltersResult:
    """The first `components` principal components of the centred patch-embedding filters (fewer when the model has
    fewer filters or values per filter)."""
    raise NotImplementedError


def positions(model: VitModel) -> PositionsResult:
    """The cosine similarity between the patches' position embeddings, or a reason why the model has none."""
    raise NotImplementedError
