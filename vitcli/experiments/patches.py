"""How an image becomes patch rows: the grid, channel-major flattening, the shared projection and the position sum."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vitcli.errors import VitcliError
from vitcli.grid import PatchGrid
from vitcli.images import ImageSource
from vitcli.model import PreparedImage, VitModel

PROJECTION_TOLERANCE = 1e-4  # largest |X W_E + b_E - Conv2d(x)| accepted before anything is shown


@dataclass
class PatchDetail:
    """One patch followed from pixels to the row that enters block 1 (all vectors full length)."""

    patch: int
    pixels: list[float]  # 3 p^2 normalized values, channel-major
    projection: list[float]  # pixels @ W_E + b_E
    position: list[float]  # the learned position embedding added to this token
    block_input: list[float]  # the row entering block 1


@dataclass
class PatchRows:
    """Every patch of one image as the rows the first block reads, and the check of the projection."""

    source: ImageSource
    grid: PatchGrid
    embed_dim: int
    weights: str
    projection_max_difference: float  # max |X W_E + b_E - Conv2d(x)| over all patches and features
    projections: list[list[float]]  # (patches, D)
    selected: list[PatchDetail]
    crop: np.ndarray  # (H, W, 3) uint8: the crop the model saw, for the figure

    @property
    def values_per_patch(self) -> int:
        return 3 * self.grid.patch_size**2


def inspect_patches(model: VitModel, image: PreparedImage, selected: list[int]) -> PatchRows:
    """Flatten, project and position every patch of one image, and check the projection against the Conv2d."""
    grid = model.grid
    trace = model.trace(image.input.unsqueeze(0), [])
    net = model.net
    with torch.inference_mode():
        conv = net.patch_embed.proj(image.input.unsqueeze(0).to(model.device)).flatten(2).transpose(1, 2).cpu()
    difference = float((trace.patch_embeddings - conv).abs().max())
    if not difference <= PROJECTION_TOLERANCE:
        raise VitcliError(
            f"self-check failed: X W_E + b_E differs from the model's Conv2d by {difference:.3g} "
            f"(tolerance {PROJECTION_TOLERANCE:g})"
        )
    # BEiT adds no absolute positions (its relative bias acts inside the attention): a zero table says so exactly.
    table = getattr(net, "pos_embed", None)
    position_table = torch.zeros(grid.num_tokens, model.embed_dim) if table is None else table[0].detach().cpu()
    details = []
    for patch in selected:
        token = grid.token_of_patch(patch)
        # Position embeddings cover the prefix tokens too unless the model adds them to patches only.
        position_index = patch - 1 if getattr(net, "no_embed_class", False) else token
        details.append(
            PatchDetail(
                patch,
                trace.patch_pixels[0, patch - 1].tolist(),
                trace.patch_embeddings[0, patch - 1].tolist(),
                position_table[position_index].tolist(),
                trace.tokens[0, token].tolist(),
            )
        )
    return PatchRows(
        image.source,
        grid,
        model.embed_dim,
        model.spec.label,
        difference,
        trace.patch_embeddings[0].tolist(),
        details,
        image.crop_uint8(),
    )
