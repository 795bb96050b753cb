"""What occlusion covers: the four quadrants or sliding windows over the model input, and the covers' drops mapped
back onto the input's pixels and patches."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from vitcli.errors import UsageError
from vitcli.grid import PatchGrid

QUADRANTS = ("top-left", "top-right", "bottom-left", "bottom-right")


@dataclass(frozen=True)
class Cover:
    """One covered region: a (left, top, right, bottom) pixel box, right and bottom exclusive."""

    name: str  # a quadrant name, Pn for a window that is exactly patch n, else Wn (windows counted from 1)
    row: int  # zero-based position in the grid of windows (for patch-sized windows: the patch grid)
    col: int
    box: tuple[int, int, int, int]
    patch: int | None = None  # n when the box is exactly patch Pn


def quadrant_covers(grid: PatchGrid) -> list[Cover]:
    """The four quadrants of the input, row by row: top-left, top-right, bottom-left, bottom-right."""
    half_height, half_width = grid.image_height // 2, grid.image_width // 2
    covers = []
    for index, name in enumerate(QUADRANTS):
        row, col = divmod(index, 2)
        box = (col * half_width, row * half_height, (col + 1) * half_width, (row + 1) * half_height)
        covers.append(Cover(name, row, col, box))
    return covers


@dataclass(frozen=True)
class SlidingWindows:
    """Square windows of `size` pixels moved by `stride` over the input, row by row, never past its edge."""

    grid: PatchGrid
    size: int
    stride: int

    def __post_init__(self) -> None:
        side = min(self.grid.image_height, self.grid.image_width)
        if not 1 <= self.size <= side:
            raise UsageError(f"--size must be between 1 and {side} pixels (the input's side), not {self.size}")
        if self.stride < 1:
            raise UsageError(f"--stride must be at least 1 pixel, not {self.stride}")

    @property
    def rows(self) -> int:
        return (self.grid.image_height - self.size) // self.stride + 1

    @property
    def cols(self) -> int:
        return (self.grid.image_width - self.size) // self.stride + 1

    def __len__(self) -> int:
        return self.rows * self.cols

    def __iter__(self) -> Iterator[Cover]:
        patch_aligned = self.size == self.grid.patch_size and self.stride % self.grid.patch_size == 0
        for row in range(self.rows):
            for col in range(self.cols):
                left, top = col * self.stride, row * self.stride
                box = (left, top, left + self.size, top + self.size)
                if patch_aligned:
                    patch = self.grid.patch_at(top // self.size, left // self.size)
                    yield Cover(f"P{patch}", row, col, box, patch)
                else:
                    yield Cover(f"W{row * self.cols + col + 1}", row, col, box)


# ----- drops on pixels and patches


def pixel_drop_map(covers: Sequence[Cover], drops: Sequence[float], grid: PatchGrid) -> Tensor:
    """(H, W) float64: each pixel's mean drop over the windows covering it; NaN where no window reaches."""
    total = torch.zeros(grid.image_height, grid.image_width, dtype=torch.float64)
    count = torch.zeros_like(total)
    for cover, drop in zip(covers, drops, strict=True):
        left, top, right, bottom = cover.box
        total[top:bottom, left:right] += drop
        count[top:bottom, left:right] += 1
    return total / count


def patch_drop_grid(pixel_map: Tensor, grid: PatchGrid) -> Tensor:
    """(rows, cols): the mean of the pixel map over each patch's pixels (NaN if any of them is uncovered)."""
    size = grid.patch_size
    trimmed = pixel_map[: grid.rows * size, : grid.cols * size]
    return trimmed.reshape(grid.rows, size, grid.cols, size).mean(dim=(1, 3))
