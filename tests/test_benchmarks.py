"""The FLOP counts the benchmarks divide by, held to the formulas of a ViT forward written out by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from occlusion import flops_per_cover, flops_per_image  # noqa: E402


def test_a_forward_counts_every_product_attention_included(tiny2):
    """Per block: q, k, v, the projection and the MLP (12 D^2 multiply-adds per row), then q k^T and the weighted sum
    of values (2 N^2 D), on top of the patch projection and the head. FlopCounterMode alone misses the attention
    products of the CPU's flash kernel: 0.36 of ViT-Tiny's 2.51 GFLOP."""
    grid, width, depth, classes = tiny2.grid, tiny2.embed_dim, tiny2.depth, tiny2.num_classes
    rows = grid.num_patches + 1
    patch_values = 3 * grid.patch_size**2
    expected = 2 * (
        grid.num_patches * patch_values * width + depth * (rows * 12 * width**2 + 2 * rows**2 * width) + width * classes
    )
    image = torch.randn(3, grid.rows * grid.patch_size, grid.cols * grid.patch_size)
    assert flops_per_image(tiny2, image) == expected


def test_a_cover_counts_the_last_block_for_the_class_token_alone(tiny2):
    """From block 1's input rows: every block but the last in full; the last computes keys and values of every row
    (4 D^2 per row) and the class token's query, attention (2 N D), projection and MLP (8 D^2)."""
    grid, width, depth, classes = tiny2.grid, tiny2.embed_dim, tiny2.depth, tiny2.num_classes
    rows = grid.num_patches + 1
    full_block = rows * 12 * width**2 + 2 * rows**2 * width
    last_block = rows * 2 * width**2 + 2 * width**2 + 2 * rows * width + 8 * width**2
    image = torch.randn(3, grid.rows * grid.patch_size, grid.cols * grid.patch_size)
    assert flops_per_cover(tiny2, image) == 2 * ((depth - 1) * full_block + last_block + width * classes)
