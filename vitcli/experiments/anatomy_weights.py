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
import torch

from vitcli.errors import VitcliError
from vitcli.experiments.anatomy_math import principal_components
from vitcli.grid import PatchGrid
from vitcli.model import VitModel

DEFAULT_COMPONENTS = 28  # the ViT paper's Figure 7 (left) shows the first 28
PREFIX_NOTE = "patches only: the prefix tokens' own position embeddings (when the model has them) are left out"


@dataclass
class FiltersResult:
    components: np.ndarray  # (k, 3, p, p) float64: component i as an RGB patch (unit length over its 3 p^2 values)
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
    weight, _ = model.patch_projection  # (3 p^2, D): one filter per column
    samples = weight.T.double().cpu().numpy()
    principal = principal_components(samples, components)
    size = model.grid.patch_size
    return FiltersResult(
        principal.components.reshape(-1, 3, size, size),
        principal.explained_variance_ratio,
        principal.singular_values,
        len(samples),
        size,
        model.spec.label,
    )


def positions(model: VitModel) -> PositionsResult:
    """The cosine similarity between the patches' position embeddings, or a reason why the model has none."""
    net, grid, label = model.net, model.grid, model.spec.label
    table = getattr(net, "pos_embed", None)
    if table is None:
        relative = "relative position bias or rotary embeddings" if _has_relative_positions(net) else "none"
        return PositionsResult(
            grid,
            None,
            f"{model.name} has no learned absolute position embeddings ({relative}): there is nothing to compare",
            PREFIX_NOTE,
            False,
            label,
        )
    rows = table.detach().reshape(-1, table.shape[-1]).double().cpu().numpy()
    if len(rows) < grid.num_patches:
        raise VitcliError(
            f"{model.name} has {len(rows)} position embeddings for {grid.num_patches} patches; "
            "vitcli reads one per patch"
        )
    patches = rows[len(rows) - grid.num_patches :]  # prefix tokens' embeddings, when there are any, come first
    unit = patches / np.linalg.norm(patches, axis=1, keepdims=True)
    return PositionsResult(grid, unit @ unit.T, None, PREFIX_NOTE, not table.requires_grad, label)


def _has_relative_positions(net: torch.nn.Module) -> bool:
    names = ("rope", "relative_position_bias_table", "rel_pos")
    return any(any(part in name for part in names) for name, _ in net.named_modules()) or any(
        "relative_position" in name for name, _ in net.named_parameters()
    )
