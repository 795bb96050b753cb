"""Exact attention weights: one query row of softmax(q k^T * scale) per block and head, summaries, and rollout.

Every weight comes from `VitModel.trace` (the explicit forward) and is shown as computed, never renormalized.
Before any result leaves this module, the explicit weights times v, joined over heads and projected, must
reproduce the attention module's own (fused) output within SELF_CHECK_TOLERANCE, and every reported row must
sum to 1 within SUM_TOLERANCE.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.table import Table
from torch import Tensor

from vitcli.errors import UsageError, VitcliError
from vitcli.grid import PatchGrid
from vitcli.images import ImageSource
from vitcli.model import PreparedImage, Trace, VitModel
from vitcli.render import weights_caption

SELF_CHECK_TOLERANCE = 1e-4  # largest |explicit - fused| attention-module output allowed, in the model's units
SUM_TOLERANCE = 1e-5  # largest |row sum - 1| allowed for a row of softmax weights
HEAD_FUSIONS = ("mean", "max", "min")
MULTI_MAP_TOP = 3  # sources listed per map when one table holds many maps


# ----- what the user asked for


@dataclass(frozen=True)
class Query:
    """The token whose row of attention weights is shown: a prefix token (CLS, ...) or a patch."""

    token: int
    name: str  # "CLS" or "P74"
    patch: int | None
    row: int | None  # zero-based grid row of the patch, None for a prefix token
    col: int | None

    @property
    def label(self) -> str:
        if self.patch is None:
            return f"{self.name} (token {self.token})"
        return f"{self.name} (token {self.token}, row {self.row}, col {self.col})"

    def to_json(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "name": self.name,
            "patch": self.patch,
            "row": self.row,
            "col": self.col,
        }


def token_query(grid: PatchGrid, token: int) -> Query:
    patch = grid.patch_of_token(token)
    row, col = grid.position(patch) if patch is not None else (None, None)
    return Query(token, grid.token_name(token), patch, row, col)


def parse_query(grid: PatchGrid, text: str) -> Query:
    """A query given as a patch (`74`, `P74`), a zero-based grid position (`r5c3`) or a prefix token name (`cls`)."""
    prefixes = {name.lower(): token for token, name in enumerate(grid.prefix_names)}
    cleaned = text.strip().lower()
    if cleaned in prefixes:
        return token_query(grid, prefixes[cleaned])
    try:
        patch = grid.parse_patch(text.strip())
    except UsageError as error:
        names = ", ".join(name.lower() for name in grid.prefix_names)
        which = "the class token" if grid.num_prefix == 1 else "the prefix tokens"
        raise UsageError(f"--query {text}: {error}; or {names} for {which}") from error
    return token_query(grid, grid.token_of_patch(patch))


def resolve_blocks(model: VitModel, block: int | None, all_blocks: bool) -> list[int]:
    """One-based block numbers to show."""
    return _resolve_counted("block", model.depth, block, all_blocks)


def resolve_heads(model: VitModel, head: int | None, all_heads: bool) -> list[int]:
    """One-based head numbers to show."""
    return _resolve_counted("head", model.num_heads, head, all_heads)


def _resolve_counted(what: str, count: int, chosen: int | None, every: bool) -> list[int]:
    if every and chosen is not None:
        raise UsageError(f"--{what} {chosen} and --all-{what}s contradict each other: give one")
    if every:
        return list(range(1, count + 1))
    if chosen is None:
        raise UsageError(f"choose a {what}: --{what} 1..{count}, or --all-{what}s")
    if not 1 <= chosen <= count:
        raise UsageError(f"--{what} must be between 1 and {count} (this model has {count} {what}s), not {chosen}")
    return [chosen]


def check_top_k(grid: PatchGrid, top_k: int) -> None:
    if not 1 <= top_k <= grid.num_tokens:
        raise UsageError(f"--top-k must be between 1 and {grid.num_tokens} (the model's tokens), not {top_k}")


# ----- the explicit forward, checked


@dataclass
class CheckedImage:
    """One image's explicit forward, restricted to the blocks asked for, after the self-check passed."""

    prepared: PreparedImage
    weights: dict[int, Tensor]  # one-based block -> (heads, N, N) softmax weights
    self_check: dict[int, float]  # one-based block -> largest |explicit - fused| attention output


def checked_traces(model: VitModel, paths: Sequence[Path], blocks: Sequence[int]) -> Iterator[CheckedImage]:
    """Trace the images batch_size at a time, keep the given one-based blocks, refuse any failing self-check."""
    model.require_standard_blocks()
    indexes = [block - 1 for block in blocks]
    for start in range(0, len(paths), model.batch_size):
        prepared = [model.prepare(path) for path in paths[start : start + model.batch_size]]
        trace = model.trace(torch.stack([image.input for image in prepared]), blocks=indexes)
        for row, image in enumerate(prepared):
            yield CheckedImage(image, *_image_blocks(model, trace, row, blocks))


def _image_blocks(model: VitModel, trace: Trace, row: int, blocks: Sequence[int]) -> tuple[dict, dict]:
    weights, self_check = {}, {}
    for block in blocks:
        whole = trace.blocks[block - 1]
        own = dataclasses.replace(
            whole,
            normed=whole.normed[row : row + 1],
            attention_output=whole.attention_output[row : row + 1],
        )
        difference = model.attention_self_check(own)
        if not difference <= SELF_CHECK_TOLERANCE:
            raise VitcliError(
                f"self-check failed in block {block}: the explicit attention differs from the module's own output "
                f"by {difference:.3g} (tolerance {SELF_CHECK_TOLERANCE:g}); no results printed"
            )
        block_weights = whole.weights[row].double()
        worst = float((block_weights.sum(dim=-1) - 1).abs().max())
        if not worst <= SUM_TOLERANCE:
            raise VitcliError(
                f"attention rows of block {block} sum to 1 only within {worst:.3g} (tolerance {SUM_TOLERANCE:g})"
            )
        weights[block] = whole.weights[row]
        self_check[block] = difference
    return weights, self_check


# ----- one query row per block and head


@dataclass
class AttentionRow:
    block: int  # one-based
    head: int  # one-based
    weights: Tensor  # (N,) over all sources, prefix tokens first; never renormalized

    @property
    def total(self) -> float:
        return float(self.weights.double().sum())

    def top(self, count: int) -> list[tuple[int, float]]:
        best = self.weights.topk(count)
        return list(zip(best.indices.tolist(), best.values.tolist()))


def patch_map(grid: PatchGrid, weights: Tensor) -> np.ndarray:
    """The patch sources of a row of N weights as a (rows, cols) array: entry [r, c] is patch r * cols + c + 1."""
    return weights[grid.num_prefix :].reshape(grid.rows, grid.cols).numpy()


@dataclass
class QueryAttention:
    """Where one query's attention goes in one image, for one or more (block, head) pairs."""

    source: ImageSource
    crop: np.ndarray  # (H, W, 3) uint8: what the model saw, for the figure
    grid: PatchGrid
    query: Query
    maps: list[AttentionRow]
    self_check: dict[int, float]
    weights_label: str
    top_k: int = 10

    def table(self) -> Table:
        if len(self.maps) == 1:
            return self._single_table(self.maps[0])
        table = _table(self.source.path, f"attention of {self.query.label}", self._caption())
        for column in (
            "block",
            "head",
            "CLS %",
            "self %",
            f"top {MULTI_MAP_TOP} sources (%)",
            "sum",
        ):
            table.add_column(column, justify="left" if column.startswith("top") else "right")
        for row in self.maps:
            top = ", ".join(
                f"{self.grid.token_name(token)} {100 * weight:.2f}" for token, weight in row.top(MULTI_MAP_TOP)
            )
            table.add_row(
                str(row.block),
                str(row.head),
                _percent(row.weights[0]),
                _percent(row.weights[self.query.token]),
                top,
                f"{row.total:.6f}",
            )
        return table

    def _single_table(self, row: AttentionRow) -> Table:
        table = _table(
            self.source.path,
            f"block {row.block}, head {row.head}: attention of {self.query.label}",
            f"CLS weight {_percent(row.weights[0])}%, self weight {_percent(row.weights[self.query.token])}%, "
            f"sum of all {self.grid.num_tokens} weights {row.total:.6f}\n{self._caption()}",
        )
        return _ranked_sources(table, self.grid, row.top(self.top_k), "weight %")

    def _caption(self) -> str:
        worst = max(self.self_check.values())
        return (
            f"self-check: explicit vs fused attention output, max |difference| {worst:.2g} "
            f"(tolerance {SELF_CHECK_TOLERANCE:g})\n{weights_caption(self.weights_label)}"
        )

    def rows(self) -> list[dict[str, Any]]:
        return [
            {
                "image": str(self.source.path),
                "block": row.block,
                "head": row.head,
                "query": self.query.name,
                "query_token": self.query.token,
                **_place(self.grid, token),
                "weight": weight,
                "weights": self.weights_label,
            }
            for row in self.maps
            for token, weight in enumerate(row.weights.tolist())
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "image": self.source.to_json(),
            "weights": self.weights_label,
            "query": self.query.to_json(),
            "grid": _grid_json(self.grid),
            "self_check": _self_check_json(self.self_check),
            "maps": [
                {
                    "block": row.block,
                    "head": row.head,
                    "cls_weight": float(row.weights[0]),
                    "self_weight": float(row.weights[self.query.token]),
                    "sum": row.total,
                    "top": [{**_place(self.grid, token), "weight": weight} for token, weight in row.top(self.top_k)],
                    "weights": row.weights.tolist(),
                }
                for row in self.maps
            ],
        }


def attend(
    model: VitModel,
    paths: Sequence[Path],
    query: Query,
    blocks: Sequence[int],
    heads: Sequence[int],
    top_k: int = 10,
) -> list[QueryAttention]:
    """The query's row of attention weights in each given (block, head), per image; blocks and heads one-based."""
    check_top_k(model.grid, top_k)
    results = []
    for image in checked_traces(model, paths, blocks):
        maps = [
            AttentionRow(block, head, image.weights[block][head - 1, query.token].clone())
            for block in blocks
            for head in heads
        ]
        results.append(
            QueryAttention(
                image.prepared.source,
                image.prepared.crop_uint8(),
                model.grid,
                query,
                maps,
                image.self_check,
                model.spec.label,
                top_k,
            )
        )
    return results


# ----- summaries per block and head


@dataclass(frozen=True)
class SummaryRow:
    block: int
    head: int
    cls_mass: float  # weight on CLS (mean over queries for --query all)
    entropy_bits: float
    mean_distance: float | None  # patches; None for a prefix-token query
    top_token: int
    top_weight: float


@dataclass
class AttentionSummary:
    """One row per block x head for one query, or averaged over every query (query None)."""

    source: ImageSource
    grid: PatchGrid
    query: Query | None
    summary: list[SummaryRow]
    self_check: dict[int, float]
    weights_label: str

    @property
    def query_label(self) -> str:
        return f"all {self.grid.num_tokens} queries (averaged)" if self.query is None else self.query.label

    def table(self) -> Table:
        worst = max(self.self_check.values())
        table = _table(
            self.source.path,
            f"attention summary of {self.query_label}",
            (
                "entropy of the row in bits; mean distance between query and patch sources in patches, "
                "weighted by their share of the patch weight"
                f"\nself-check max |difference| {worst:.2g} (tolerance {SELF_CHECK_TOLERANCE:g})"
                f"\n{weights_caption(self.weights_label)}"
            ),
        )
        top = "top source (mean weight %)" if self.query is None else "top source (weight %)"
        for column in (
            "block",
            "head",
            "CLS %",
            "entropy (bits)",
            "mean distance",
            top,
        ):
            table.add_column(column, justify="right")
        for row in self.summary:
            table.add_row(
                str(row.block),
                str(row.head),
                f"{100 * row.cls_mass:.2f}",
                f"{row.entropy_bits:.3f}",
                "-" if row.mean_distance is None else f"{row.mean_distance:.2f}",
                f"{self.grid.token_name(row.top_token)} {100 * row.top_weight:.2f}",
            )
        return table

    def rows(self) -> list[dict[str, Any]]:
        return [
            {
                "image": str(self.source.path),
                "query": "all" if self.query is None else self.query.name,
                "block": row.block,
                "head": row.head,
                "cls_mass": row.cls_mass,
                "entropy_bits": row.entropy_bits,
                "mean_distance_patches": row.mean_distance,
                "top_source": self.grid.token_name(row.top_token),
                "top_token": row.top_token,
                "top_weight": row.top_weight,
                "weights": self.weights_label,
            }
            for row in self.summary
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "image": self.source.to_json(),
            "weights": self.weights_label,
            "query": "all" if self.query is None else self.query.to_json(),
            "grid": _grid_json(self.grid),
            "self_check": _self_check_json(self.self_check),
            "summary": [
                {key: value for key, value in row.items() if key not in ("image", "weights")} for row in self.rows()
            ],
        }


def patch_distances(grid: PatchGrid) -> Tensor:
    """(patches, patches) Euclidean distances between patch centres, in patches."""
    rows, cols = torch.meshgrid(torch.arange(grid.rows), torch.arange(grid.cols), indexing="ij")
    centres = torch.stack([rows.flatten(), cols.flatten()], dim=-1).double()
    return torch.cdist(centres, centres)


def row_statistics(grid: PatchGrid, weights: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """For (..., N, N) weights: CLS mass, entropy in bits and mean patch distance of every query row.

    The distance of a prefix-token query is NaN: it has no place in the grid.
    """
    weights = weights.double()
    entropy = -torch.special.xlogy(weights, weights).sum(dim=-1) / math.log(2)
    patch_weights = weights[..., grid.num_prefix :]
    distance = torch.full(weights.shape[:-1], math.nan, dtype=torch.float64)
    patch_queries = patch_weights[..., grid.num_prefix :, :]
    distance[..., grid.num_prefix :] = (patch_queries * patch_distances(grid)).sum(dim=-1) / patch_queries.sum(dim=-1)
    return weights[..., 0], entropy, distance


def summarize(model: VitModel, paths: Sequence[Path], query: Query | None) -> list[AttentionSummary]:
    """Per image, one SummaryRow per block x head for the query, or averaged over all queries when query is None."""
    blocks = list(range(1, model.depth + 1))
    results = []
    for image in checked_traces(model, paths, blocks):
        summary = []
        for block in blocks:
            weights = image.weights[block]
            cls_mass, entropy, distance = row_statistics(model.grid, weights)
            for head in range(model.num_heads):
                if query is None:
                    received = weights[head].double().mean(dim=0)
                    top_weight, top_token = received.max(dim=0)
                    row = SummaryRow(
                        block,
                        head + 1,
                        float(cls_mass[head].mean()),
                        float(entropy[head].mean()),
                        float(distance[head, model.grid.num_prefix :].mean()),
                        int(top_token),
                        float(top_weight),
                    )
                else:
                    top_weight, top_token = weights[head, query.token].max(dim=0)
                    own_distance = float(distance[head, query.token])
                    row = SummaryRow(
                        block,
                        head + 1,
                        float(cls_mass[head, query.token]),
                        float(entropy[head, query.token]),
                        None if math.isnan(own_distance) else own_distance,
                        int(top_token),
                        float(top_weight),
                    )
                summary.append(row)
        results.append(
            AttentionSummary(
                image.prepared.source,
                model.grid,
                query,
                summary,
                image.self_check,
                model.spec.label,
            )
        )
    return results


# ----- rollout


def check_rollout_options(head_fusion: str, discard_ratio: float) -> None:
    if head_fusion not in HEAD_FUSIONS:
        raise UsageError(f"--head-fusion must be one of {', '.join(HEAD_FUSIONS)}, not {head_fusion}")
    if not 0.0 <= discard_ratio < 1.0:
        raise UsageError(f"--discard-ratio must be at least 0 and below 1, not {discard_ratio:g}")


def attention_rollout(attention: Tensor, head_fusion: str = "mean", discard_ratio: float = 0.0) -> Tensor:
    """Attention rollout (Abnar and Zuidema 2020) of (blocks, heads, N, N) weights given in block order.

    Per block: the heads are fused (mean, max or min); with a discard ratio r, the floor(r * N) smallest fused
    weights of each row are set to zero, the CLS column (token 0) excepted; the identity is added for the residual
    path and each row renormalized to sum 1. The result is the product A_L ... A_1, (N, N): row i is how much of
    token i's final representation flows, through attention and residuals, from each input token.
    """
    check_rollout_options(head_fusion, discard_ratio)
    attention = attention.double()
    tokens = attention.shape[-1]
    identity = torch.eye(tokens, dtype=torch.float64)
    discard = int(discard_ratio * tokens)
    rollout = identity
    for block in attention:
        fused = {
            "mean": block.mean(dim=0),
            "max": block.amax(dim=0),
            "min": block.amin(dim=0),
        }[head_fusion]
        if discard:
            candidates = fused.clone()
            candidates[:, 0] = math.inf
            fused = fused.scatter(-1, candidates.topk(discard, dim=-1, largest=False).indices, 0.0)
        step = fused + identity
        rollout = (step / step.sum(dim=-1, keepdim=True)) @ rollout
    return rollout


@dataclass
class Rollout:
    """The rollout row of one query in one image: not a single head's weights."""

    source: ImageSource
    crop: np.ndarray
    grid: PatchGrid
    query: Query
    head_fusion: str
    discard_ratio: float
    weights: Tensor  # (N,) rollout row; sums to 1
    self_check: dict[int, float]
    weights_label: str
    top_k: int = 10

    @property
    def method(self) -> str:
        return f"attention ROLLOUT over {len(self.self_check)} blocks, head fusion {self.head_fusion}, discard ratio {self.discard_ratio:g}"

    def table(self) -> Table:
        worst = max(self.self_check.values())
        table = _table(
            self.source.path,
            f"{self.method}: row of {self.query.label}",
            (
                f"rollout (Abnar and Zuidema 2020), not a single head's weights: CLS {_percent(self.weights[0])}%, "
                f"sum {float(self.weights.sum()):.6f}\nself-check max |difference| {worst:.2g} "
                f"(tolerance {SELF_CHECK_TOLERANCE:g})\n{weights_caption(self.weights_label)}"
            ),
        )
        best = self.weights.topk(self.top_k)
        return _ranked_sources(table, self.grid, list(zip(best.indices.tolist(), best.values.tolist())), "rollout %")

    def rows(self) -> list[dict[str, Any]]:
        return [
            {
                "image": str(self.source.path),
                "method": "rollout",
                "head_fusion": self.head_fusion,
                "discard_ratio": self.discard_ratio,
                "query": self.query.name,
                "query_token": self.query.token,
                **_place(self.grid, token),
                "rollout": value,
                "weights": self.weights_label,
            }
            for token, value in enumerate(self.weights.tolist())
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "image": self.source.to_json(),
            "weights": self.weights_label,
            "method": "attention rollout (Abnar and Zuidema 2020): heads fused, identity added, rows renormalized",
            "head_fusion": self.head_fusion,
            "discard_ratio": self.discard_ratio,
            "blocks": sorted(self.self_check),
            "query": self.query.to_json(),
            "grid": _grid_json(self.grid),
            "self_check": _self_check_json(self.self_check),
            "rollout": self.weights.tolist(),
        }


def rollout(
    model: VitModel,
    paths: Sequence[Path],
    query: Query,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    top_k: int = 10,
) -> list[Rollout]:
    """The rollout row of the query through every block, per image."""
    check_top_k(model.grid, top_k)
    check_rollout_options(head_fusion, discard_ratio)
    blocks = list(range(1, model.depth + 1))
    results = []
    for image in checked_traces(model, paths, blocks):
        stacked = torch.stack([image.weights[block] for block in blocks])
        row = attention_rollout(stacked, head_fusion, discard_ratio)[query.token].clone()
        results.append(
            Rollout(
                image.prepared.source,
                image.prepared.crop_uint8(),
                model.grid,
                query,
                head_fusion,
                discard_ratio,
                row,
                image.self_check,
                model.spec.label,
                top_k,
            )
        )
    return results


# ----- figures


def attention_figure(result: QueryAttention) -> Any:
    """The crop with each map as a heat overlay; one common scale (0 to the largest patch weight shown)."""
    from vitcli import figures

    blocks = sorted({row.block for row in result.maps})
    heads = sorted({row.head for row in result.maps})
    shown = result.maps
    if len(blocks) > 1 and len(heads) > 1:
        # Heads down, blocks across: reading left to right follows the query through depth.
        rows, columns = len(heads), len(blocks)
        shown = sorted(result.maps, key=lambda row: (row.head, row.block))
    else:
        columns = min(len(shown), 6)
        rows = math.ceil(len(shown) / columns)
    maps = [patch_map(result.grid, row.weights) for row in shown]
    top = max(float(values.max()) for values in maps)
    fig, panels = figures.figure(columns, rows=rows, size=5.0 if len(maps) == 1 else 3.2 if len(maps) <= 12 else 2.4)
    for panel, row, values in zip(panels, shown, maps):
        mappable = figures.overlay(panel, result.crop, values, "inferno", 0.0, top)
        _mark_query(figures, panel, result.grid, result.query)
        panel.set_title(f"block {row.block}, head {row.head}", fontsize=9)
        panel.set_xlabel(f"CLS weight {_percent(row.weights[0])}% (not on the grid)", fontsize=8)
    for panel in panels[len(maps) :]:
        panel.set_visible(False)
    colorbar = fig.colorbar(mappable, ax=panels, shrink=0.8 if rows == 1 else 0.6)
    colorbar.set_label("attention weight (not renormalized)")
    scale = "colours from 0 to this map's largest patch weight" if len(maps) == 1 else "one colour scale for all maps"
    figures.title(
        fig,
        f"{result.source.path.name}: attention of query {result.query.label}; {scale}",
        result.weights_label,
    )
    return fig


def rollout_figure(result: Rollout) -> Any:
    from vitcli import figures

    fig, panels = figures.figure(1, rows=1, size=5.0)
    values = patch_map(result.grid, result.weights.float())
    mappable = figures.overlay(panels[0], result.crop, values, "viridis", 0.0, float(values.max()))
    _mark_query(figures, panels[0], result.grid, result.query)
    panels[0].set_xlabel(f"rollout to CLS {_percent(result.weights[0])}% (not on the grid)", fontsize=8)
    fig.colorbar(mappable, ax=panels, shrink=0.8).set_label("rollout (scaled to this map's maximum)")
    figures.title(
        fig,
        f"{result.source.path.name}: {result.method}\nrow of {result.query.label}: not a single head's weights",
        result.weights_label,
    )
    return fig


def _mark_query(figures: Any, panel: Any, grid: PatchGrid, query: Query) -> None:
    if query.patch is not None:
        figures.outline(panel, grid.pixel_box(query.patch), color="cyan")


# ----- small shared pieces


def _table(path: Path, what: str, caption: str) -> Table:
    """A table titled by what it shows (kept on one line) and the image it shows it for."""
    return Table(title=f"{what}\n{path}", caption=caption, min_width=len(what) + 4)


def _ranked_sources(table: Table, grid: PatchGrid, ranked: list[tuple[int, float]], value_column: str) -> Table:
    """Fill a table with sources ranked by a share of attention: rank, token, patch, row, col, percent."""
    for column in ("rank", "token", "patch", "row", "col", value_column):
        table.add_column(column, justify="right")
    for rank, (token, value) in enumerate(ranked, start=1):
        place = _place(grid, token)
        table.add_row(
            str(rank), str(token), place["patch"], _blank(place["row"]), _blank(place["col"]), f"{100 * value:.4f}"
        )
    return table


def _place(grid: PatchGrid, token: int) -> dict[str, Any]:
    patch = grid.patch_of_token(token)
    row, col = grid.position(patch) if patch is not None else (None, None)
    return {"token": token, "patch": grid.token_name(token), "row": row, "col": col}


def _percent(weight: Tensor | float) -> str:
    return f"{100 * float(weight):.2f}"


def _blank(value: int | None) -> str:
    return "-" if value is None else str(value)


def _grid_json(grid: PatchGrid) -> dict[str, Any]:
    return {
        "rows": grid.rows,
        "cols": grid.cols,
        "patch_size": grid.patch_size,
        "tokens": grid.num_tokens,
        "prefix_tokens": list(grid.prefix_names),
    }


def _self_check_json(self_check: dict[int, float]) -> dict[str, Any]:
    return {
        "tolerance": SELF_CHECK_TOLERANCE,
        "what": "largest |explicit weights @ v, heads joined and projected - the attention module's own output|",
        "max_abs_difference_by_block": {str(block): difference for block, difference in sorted(self_check.items())},
    }
