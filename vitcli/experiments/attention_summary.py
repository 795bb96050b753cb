"""Attention summarized per block and head: CLS mass, entropy, mean distance and top source of a query's row.

With no query, each statistic is averaged over every query row of the block and head.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from vitcli.experiments.attention import CheckedImage, Query, checked_traces
from vitcli.grid import PatchGrid
from vitcli.images import ImageSource
from vitcli.model import PreparedImage, VitModel


@dataclass(frozen=True)
class SummaryRow:
    block: int  # one-based
    head: int  # one-based
    cls_mass: float  # attention on CLS (mean over queries when averaged)
    entropy_bits: float
    mean_distance: float | None  # patches; None for a prefix-token query
    top_token: int  # the source with the most attention (mean attention received when averaged)
    top_attention: float


@dataclass
class AttentionSummary:
    """One row per block x head for one query, or averaged over every query (query None)."""

    source: ImageSource
    grid: PatchGrid
    query: Query | None
    entries: list[SummaryRow]
    self_check: dict[int, float]  # one-based block -> largest |explicit - fused| attention output
    weights: str  # the model weights' label


def patch_distances(grid: PatchGrid) -> Tensor:
    """(patches, patches) Euclidean distances between patch centres, in patches."""
    rows, cols = torch.meshgrid(torch.arange(grid.rows), torch.arange(grid.cols), indexing="ij")
    centres = torch.stack([rows.flatten(), cols.flatten()], dim=-1).double()
    return torch.cdist(centres, centres)


def row_statistics(grid: PatchGrid, attention: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """For (..., N, N) attention: CLS mass, entropy in bits and mean patch distance of every query row.

    The mean distance weighs each patch source by its share of the row's patch attention. A prefix-token query has
    no place in the grid: its distance is NaN.
    """
    attention = attention.double()
    entropy = -torch.special.xlogy(attention, attention).sum(dim=-1) / math.log(2)
    distance = torch.full(attention.shape[:-1], math.nan, dtype=torch.float64)
    patch_rows = attention[..., grid.num_prefix :, grid.num_prefix :]
    distance[..., grid.num_prefix :] = (patch_rows * patch_distances(grid)).sum(dim=-1) / patch_rows.sum(dim=-1)
    return attention[..., 0], entropy, distance


def summarize(model: VitModel, images: Sequence[PreparedImage], query: Query | None) -> list[AttentionSummary]:
    """Per image, one SummaryRow per block x head for the query, or averaged over all queries when query is None."""
    blocks = list(range(1, model.depth + 1))
    return [
        AttentionSummary(
            image.prepared.source,
            model.grid,
            query,
            _entries(model.grid, image, query),
            image.self_check,
            model.spec.label,
        )
        for image in checked_traces(model, images, blocks)
    ]


def _entries(grid: PatchGrid, image: CheckedImage, query: Query | None) -> list[SummaryRow]:
    entries = []
    for block, attention in image.attention.items():
        cls_mass, entropy, distance = row_statistics(grid, attention)
        for head in range(attention.shape[0]):
            if query is None:
                top_attention, top_token = attention[head].double().mean(dim=0).max(dim=0)
                statistics = (
                    float(cls_mass[head].mean()),
                    float(entropy[head].mean()),
                    float(distance[head, grid.num_prefix :].mean()),
                )
            else:
                top_attention, top_token = attention[head, query.token].max(dim=0)
                own_distance = float(distance[head, query.token])
                statistics = (
                    float(cls_mass[head, query.token]),
                    float(entropy[head, query.token]),
                    None if math.isnan(own_distance) else own_distance,
                )
            entries.append(SummaryRow(block, head + 1, *statistics, int(top_token), float(top_attention)))
    return entries
