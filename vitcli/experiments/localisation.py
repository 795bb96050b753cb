"""Does a map point at the object? The pointing game and relevance mass accuracy against a segmentation mask.

The mask of IMAGE is MASKS/STEM.png (IMAGE's stem). An Oxford-IIIT Pet trimap (values within {1, 2, 3}) marks the
object with 1 (2 is background, 3 the uncertain border, both counted as not object); any other mask marks the object
with every non-zero value. A mask whose size differs from the image's is resized to it with nearest neighbours (the
result says so); then it follows the image through the eval transform's resize and centre crop, nearest again.
Each patch's object share f_p is the fraction of its pixels on the object.

- Pointing game (Zhang et al. 2016, at patch resolution): the map's largest patch (ties by patch number) is a hit
  when at least half of its pixels are on the object.
- Relevance mass accuracy (Arras, Osman and Samek 2022): sum_p max(v_p, 0) f_p / sum_p max(v_p, 0), the share of
  the positive map mass on the object when each patch's value is spread evenly over its pixels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vitcli.errors import VitcliError
from vitcli.grid import PatchGrid
from vitcli.images import decode
from vitcli.model import PreparedImage, VitModel

HIT_SHARE = 0.5  # the largest patch is "on the object" when at least this share of its pixels is
TRIMAP_VALUES = frozenset({1, 2, 3})
LABEL_MODES = ("L", "P", "I", "1")  # one channel of labels, read as they are


@dataclass
class MethodLocalisation:
    method: str
    top_patch: int  # patch number of the largest value
    hit: bool  # pointing game
    mass_accuracy: float | None  # None when the map has no positive mass


@dataclass
class Localisation:
    mask: Path
    kind: str  # "trimap" (1 = object) or "binary" (non-zero = object)
    resized: bool  # the mask's size differed from the image's and was resized (nearest)
    object_share: np.ndarray  # (rows, cols) fraction of each patch's pixels on the object
    methods: list[MethodLocalisation]


def find_mask(folder: Path, image: Path) -> Path:
    """MASKS/STEM.png for an image (suffix case ignored)."""
    for candidate in sorted(folder.glob(f"{image.stem}.*")):
        if candidate.suffix.lower() == ".png" and candidate.is_file():
            return candidate
    raise VitcliError(f"no mask for {image.name} in {folder}: expected {folder / (image.stem + '.png')}")


def read_mask(path: Path) -> tuple[np.ndarray, str]:
    """(h, w) bool object mask at the file's size, and its kind."""
    try:
        values, _ = decode(
            path, lambda opened: np.asarray(opened if opened.mode in LABEL_MODES else opened.convert("L"))
        )
    except VitcliError as error:  # the refusals of any image vitcli reads: not an image, a bomb, damaged
        raise VitcliError(f"the mask {error}") from error
    if values.ndim != 2:
        raise VitcliError(f"the mask {path} is not one channel of labels")
    present = set(np.unique(values).tolist())
    if present <= TRIMAP_VALUES:
        return values == 1, "trimap"
    return values != 0, "binary"


def object_share(model: VitModel, prepared: PreparedImage, mask: np.ndarray) -> tuple[np.ndarray, bool]:
    """(rows, cols) share of each patch's pixels on the object, and whether the mask had to be resized."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as transforms

    width, height = prepared.source.original_size
    labels = torch.from_numpy(mask.astype(np.uint8))
    resized = tuple(labels.shape) != (height, width)
    if resized:
        labels = transforms.resize(labels[None], [height, width], InterpolationMode.NEAREST, antialias=False)[0]
    cropped = model.crop_mask(labels).double()
    return patch_shares(model.grid, cropped), resized


def patch_shares(grid: PatchGrid, pixels: torch.Tensor) -> np.ndarray:
    """(rows, cols) mean of an (H, W) 0/1 mask over each patch's pixels."""
    size = grid.patch_size
    inside = pixels[: grid.rows * size, : grid.cols * size]
    return inside.reshape(grid.rows, size, grid.cols, size).mean(dim=(1, 3)).numpy()


def score_map(method: str, values: np.ndarray, share: np.ndarray) -> MethodLocalisation:
    flat = values.reshape(-1)
    valid = np.where(np.isnan(flat), -np.inf, flat)
    top = int(np.argmax(valid))  # the first of tied maxima: the lowest patch number
    positive = np.clip(np.nan_to_num(flat, nan=0.0), 0, None)
    total = float(positive.sum())
    mass = float((positive * share.reshape(-1)).sum() / total) if total > 0 else None
    return MethodLocalisation(method, top + 1, bool(share.reshape(-1)[top] >= HIT_SHARE), mass)


def localise(
    model: VitModel, prepared: PreparedImage, folder: Path, maps: Sequence[tuple[str, np.ndarray]]
) -> Localisation:
    """Pointing game and relevance mass accuracy of each (method, (rows, cols) map) against the image's mask."""
    path = find_mask(folder, prepared.source.path)
    mask, kind = read_mask(path)
    share, resized = object_share(model, prepared, mask)
    return Localisation(path, kind, resized, share, [score_map(method, values, share) for method, values in maps])
