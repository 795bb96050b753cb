"""Does a map point at the object? The pointing game, relevance mass accuracy and Focus against a segmentation mask.

The mask of IMAGE is MASKS/STEM.png (IMAGE's stem). An Oxford-IIIT Pet trimap (values within {1, 2, 3}) marks the
object with 1 (2 is background, 3 the uncertain border, both counted as not object); any other mask marks the object
with every non-zero value. A mask whose size differs from the image's is resized to it with nearest neighbours (the
result says so); then it follows the image through the eval transform's resize and centre crop, nearest again.
Each patch's object share f_p is the fraction of its pixels on the object.

- Pointing game (Zhang et al. 2016, at patch resolution): the map's largest patch (ties by patch number) is a hit
  when at least half of its pixels are on the object.
- Relevance mass accuracy (Arras, Osman and Samek 2022), two ways, as papers use both:
  `mass_accuracy` = sum_p max(v_p, 0) f_p / sum_p max(v_p, 0), the share of the positive map mass on the object when
  each patch's value is spread evenly over its pixels; `mass_accuracy_signed` = sum_p v_p f_p / sum_p v_p, Quantus's
  RelevanceMassAccuracy on the raw map (negative values count; no value when the map sums to 0, and above 1 or below
  0 when the negative mass is large). The two agree on maps without negative values.
- Focus (Arias-Duart et al. 2022) on a 2x2 mosaic: the share of the positive mass in the target class's quadrants,
  split at half the model input's height and width (Quantus's split). A mask whose object is exactly one to three
  whole quadrants of the mask (split at half its height and width) is read as a mosaic's target quadrants: Focus is
  then reported too. The eval transform's centre crop keeps the mosaic's centre, so the quadrants of the mask are
  those of the crop.

Against Quantus 0.6.0 on the patch map repeated over each patch's pixels (tests/test_bench_scores.py): the masses and
Focus are equal (Focus up to Quantus's 1e-9 added to the denominator). The pointing game differs by protocol: Quantus
counts a hit when any pixel of any tied maximum lies on the object; here the one largest patch (ties by patch number)
needs at least HIT_SHARE of its pixels on it. On masks that cover each patch wholly or not at all, without tied
maxima, the two agree; pointing_game_any_pixel is Quantus's protocol, for comparison with papers that used it.
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
    mass_accuracy: float | None  # positive mass on the object; None when the map has no positive mass
    mass_accuracy_signed: float | None  # Quantus's signed mass on the object; None when the map sums to 0
    focus: float | None = None  # only against a mosaic's quadrant mask; None also when the map has no positive mass


@dataclass
class Localisation:
    mask: Path
    kind: str  # "trimap" (1 = object) or "binary" (non-zero = object)
    resized: bool  # the mask's size differed from the image's and was resized (nearest)
    object_share: np.ndarray  # (rows, cols) fraction of each patch's pixels on the object
    methods: list[MethodLocalisation]
    quadrants: tuple[int, int, int, int] | None = None  # a mosaic's target quadrants (QUADRANTS' order), if any


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


# ----- the scores, on (rows, cols) patch maps and object shares; NaN values count as absent (no mass, never top)


def top_patch(values: np.ndarray) -> int:
    """The flat (0-based) index of the map's largest value; ties go to the lowest index, NaN never wins."""
    flat = values.reshape(-1)
    return int(np.argmax(np.where(np.isnan(flat), -np.inf, flat)))


def pointing_game(values: np.ndarray, share: np.ndarray) -> bool:
    """A hit when the largest patch has at least HIT_SHARE of its pixels on the object."""
    return bool(share.reshape(-1)[top_patch(values)] >= HIT_SHARE)


def pointing_game_any_pixel(values: np.ndarray, share: np.ndarray) -> bool:
    """Quantus's protocol at patch resolution: a hit when any tied largest patch has any pixel on the object."""
    flat = np.where(np.isnan(values.reshape(-1)), -np.inf, values.reshape(-1))
    return bool((share.reshape(-1)[flat == flat.max()] > 0).any())


def mass_accuracy(values: np.ndarray, share: np.ndarray) -> float | None:
    """sum max(v, 0) f / sum max(v, 0): the share of the positive mass on the object; None without positive mass."""
    positive = np.clip(np.nan_to_num(values.reshape(-1), nan=0.0), 0, None)
    total = float(positive.sum())
    return float((positive * share.reshape(-1)).sum() / total) if total > 0 else None


def signed_mass_accuracy(values: np.ndarray, share: np.ndarray) -> float | None:
    """sum v f / sum v (Quantus's RelevanceMassAccuracy): None when the map sums to 0."""
    flat = np.nan_to_num(values.reshape(-1), nan=0.0)
    total = float(flat.sum())
    return float((flat * share.reshape(-1)).sum() / total) if total != 0 else None


QUADRANTS = ("top left", "top right", "bottom left", "bottom right")  # Quantus's Focus order


def check_quadrants(quadrants: tuple[int, ...]) -> tuple[int, int, int, int]:
    """Four 0/1 flags in QUADRANTS' order with at least one target quadrant."""
    flags = tuple(int(flag) for flag in quadrants)
    if len(flags) != 4 or not set(flags) <= {0, 1} or not any(flags):
        raise VitcliError(f"target quadrants must be four 0/1 flags ({', '.join(QUADRANTS)}), at least one 1")
    return flags  # type: ignore[return-value]


def quadrant_share(rows: int, cols: int, patch_size: int, quadrants: tuple[int, ...]) -> np.ndarray:
    """(rows, cols) share of each patch's pixels in the target quadrants of the rows x cols grid of patch_size
    pixels, split at half its pixel height and width (as Quantus splits; on an odd grid the middle patches straddle)."""
    flags = check_quadrants(quadrants)
    height, width = rows * patch_size, cols * patch_size
    pixels = np.zeros((height, width))
    half_height, half_width = height // 2, width // 2
    pixels[:half_height, :half_width] = flags[0]
    pixels[:half_height, half_width:] = flags[1]
    pixels[half_height:, :half_width] = flags[2]
    pixels[half_height:, half_width:] = flags[3]
    return pixels.reshape(rows, patch_size, cols, patch_size).mean(axis=(1, 3))


def focus(values: np.ndarray, quadrants: tuple[int, ...], patch_size: int = 16) -> float | None:
    """Focus (Arias-Duart et al. 2022): the share of the map's positive mass in the mosaic's target quadrants (flags
    in QUADRANTS' order); None without positive mass (Quantus returns 0 there)."""
    rows, cols = values.shape
    return mass_accuracy(values, quadrant_share(rows, cols, patch_size, quadrants))


def mosaic_quadrants(mask: np.ndarray) -> tuple[int, int, int, int] | None:
    """The target quadrants of an (h, w) object mask that is exactly one to three whole quadrants (split at h // 2,
    w // 2), in QUADRANTS' order; None for any other mask."""
    height, width = mask.shape
    if height < 2 or width < 2:
        return None
    half_height, half_width = height // 2, width // 2
    parts = (
        mask[:half_height, :half_width],
        mask[:half_height, half_width:],
        mask[half_height:, :half_width],
        mask[half_height:, half_width:],
    )
    if not all(part.all() or not part.any() for part in parts):
        return None
    flags = tuple(int(part.all()) for part in parts)
    return flags if 0 < sum(flags) < 4 else None  # type: ignore[return-value]


def score_map(
    method: str,
    values: np.ndarray,
    share: np.ndarray,
    quadrants: tuple[int, ...] | None = None,
    patch_size: int = 16,
) -> MethodLocalisation:
    """Every localisation score of one (rows, cols) map; Focus only when the target quadrants are given."""
    return MethodLocalisation(
        method,
        top_patch(values) + 1,
        pointing_game(values, share),
        mass_accuracy(values, share),
        signed_mass_accuracy(values, share),
        None if quadrants is None else focus(values, quadrants, patch_size),
    )


def localise(
    model: VitModel, prepared: PreparedImage, folder: Path, maps: Sequence[tuple[str, np.ndarray]]
) -> Localisation:
    """The localisation scores of each (method, (rows, cols) map) against the image's mask (Focus too when the mask
    marks a mosaic's target quadrants)."""
    path = find_mask(folder, prepared.source.path)
    mask, kind = read_mask(path)
    share, resized = object_share(model, prepared, mask)
    quadrants = mosaic_quadrants(mask)
    size = model.map_grid.patch_size
    scores = [score_map(method, values, share, quadrants, size) for method, values in maps]
    return Localisation(path, kind, resized, share, scores, quadrants)
