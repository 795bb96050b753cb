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
    net = model.net
    with torch.inference_mode():
        inputs = image.input.unsqueeze(0).to(model.device)
        pixels = model.flatten_patches(inputs)
        weight, bias = model.patch_projection
        embeddings = (pixels @ weight + bias).cpu()
        tokens = model.embed(inputs).cpu()  # the model's own layers: the rows block 1 reads
        conv = net.patch_embed.proj(inputs).flatten(2).transpose(1, 2).cpu()
    pixels = pixels.cpu()
    difference = float((embeddings - conv).abs().max())
    if not difference <= PROJECTION_TOLERANCE:
        raise VitcliError(
            f"self-check failed: X W_E + b_E differs from the model's Conv2d by {difference:.3g} "
            f"(tolerance {PROJECTION_TOLERANCE:g})"
        )
    # BEiT adds no absolute positions (its relative bias acts inside the attention): a zero table says so exactly.
    table = getattr(net, "pos_embed", None)
    width = model.embed_dim
    position_table = torch.zeros(grid.num_tokens, width) if table is None else table.detach().reshape(-1, width).cpu()
    details = []
    for patch in selected:
        token = grid.token_of_patch(patch)
        # The patches' position embeddings come last: before them those of the prefix tokens that have one (none when
        # timm adds them to patches only; CLS but not the registers in transformers' Dinov2).
        position_index = len(position_table) - grid.num_patches + patch - 1
        details.append(
            PatchDetail(
                patch,
                pixels[0, patch - 1].tolist(),
                embeddings[0, patch - 1].tolist(),
                position_table[position_index].tolist(),
                tokens[0, token].tolist(),
            )
        )
    return PatchRows(
        image.source,
        grid,
        model.embed_dim,
        model.spec.label,
        difference,
        embeddings[0].tolist(),
        details,
        image.crop_uint8(),
    )
