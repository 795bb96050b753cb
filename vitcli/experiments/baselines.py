"""Two reference maps that read the image alone, never the model, for a benchmark to beat: `random` and `edge`.

- random: each patch an independent draw, uniform in [0, 1), from numpy's default generator seeded with the seed and
  a SHA-256 digest of the normalized model input: the same image and seed give the same map, another image (or the
  same image perturbed, as --robustness does) a fresh one. Its pointing game is then, in expectation, the share of
  patches that count as on the object; it fails the sanity checks (it ignores the model) by construction.
- edge: the Sobel gradient magnitude sqrt(Gx^2 + Gy^2) of the grayscale model input (ITU-R 601 luma
  0.299 R + 0.587 G + 0.114 B of the de-normalized pixels in [0, 1]; 3x3 kernels [1, 2, 1] x [-1, 0, 1], borders
  mirrored as scipy.ndimage's 'reflect'), averaged over each patch's pixels: the edge detector that Adebayo et al.
  2018 showed looks like a saliency map.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from vitcli.grid import PatchGrid
from vitcli.model import PreparedImage, VitModel

LUMA = (0.299, 0.587, 0.114)  # ITU-R 601, as PIL's convert("L")

RANDOM_DEFINITION = "uniform in [0, 1) per patch, seeded by --noise-seed and the input's SHA-256; reads no model"
EDGE_DEFINITION = (
    "Sobel gradient magnitude of the grayscale (ITU-R 601) input, mean over each patch's pixels; reads no model"
)


def input_digest(pixels: torch.Tensor) -> int:
    """The first 8 bytes of the SHA-256 of a tensor's float32 values, as an integer."""
    values = pixels.detach().to(torch.float32).cpu().contiguous().numpy()
    return int.from_bytes(hashlib.sha256(values.tobytes()).digest()[:8], "big")


def random_map(pixels: torch.Tensor, rows: int, cols: int, seed: int) -> np.ndarray:
    """(rows, cols) float64 uniform in [0, 1), drawn by default_rng([seed, input_digest(pixels)])."""
    return np.random.default_rng([seed, input_digest(pixels)]).random((rows, cols))


def edge_magnitude(rgb: np.ndarray) -> np.ndarray:
    """(H, W) Sobel gradient magnitude of the luma of a (3, H, W) image."""
    from scipy import ndimage  # here: explain imports this module, and most runs draw no edge map

    gray = np.tensordot(np.asarray(LUMA), rgb.astype(np.float64), axes=1)
    return np.hypot(ndimage.sobel(gray, axis=0, mode="reflect"), ndimage.sobel(gray, axis=1, mode="reflect"))


def edge_map(rgb: np.ndarray, grid: PatchGrid) -> np.ndarray:
    """(rows, cols) mean edge magnitude over each patch's pixels of a (3, H, W) image in [0, 1]."""
    size = grid.patch_size
    magnitude = edge_magnitude(rgb)[: grid.rows * size, : grid.cols * size]
    return magnitude.reshape(grid.rows, size, grid.cols, size).mean(axis=(1, 3))


def baseline_map(model: VitModel, prepared: PreparedImage, method: str, seed: int) -> tuple[np.ndarray, str, str]:
    """(values, unit, definition) of the `random` or `edge` baseline on the model's map grid."""
    grid = model.map_grid
    if method == "random":
        return random_map(prepared.input, grid.rows, grid.cols, seed), "uniform draw", RANDOM_DEFINITION
    mean = torch.tensor(model.mean, dtype=torch.float64).reshape(3, 1, 1)
    std = torch.tensor(model.std, dtype=torch.float64).reshape(3, 1, 1)
    pixels = (prepared.input.detach().cpu().double() * std + mean).numpy()
    return edge_map(pixels, grid), "Sobel magnitude (pixel range 1)", EDGE_DEFINITION
