"""`vitcli attend` as a library: its Job (settings, plan, name, computation, presentation) and the builder
that the command, `vitcli run` configs and the Python API call."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

import typer

from vitcli.errors import UsageError
from vitcli.jobs import ImageWork, Job, Presentation, builds_jobs
from vitcli.naming import result_name, setting
from vitcli.spec import fitted_count


class View(StrEnum):
    map = "map"
    summary = "summary"
    rollout = "rollout"
    all_blocks = "all-blocks"


class HeadFusion(StrEnum):
    mean = "mean"
    max = "max"
    min = "min"


class Scale(StrEnum):
    own = "own"
    zero = "zero"


_ROLLOUT = "Rollout options"
DEFAULT_TOP_K = 10


@dataclass(frozen=True)
class AttendPlan:
    """An attend job's query, blocks and heads resolved against the model's grid (AttendJob.plan)."""

    top_k: int  # --top-k, or its default fitted to the model's tokens
    query: Any = None  # experiments.attention.Query; None with --query all and with --pool
    blocks: tuple[int, ...] = ()  # one-based, for map and all-blocks (Swin: the block of the query's stage)
    heads: tuple[int, ...] = ()  # one-based, for map, all-blocks and --pool


class AttendJob(Job):
    """One view of one query's attention; the query, blocks and heads are resolved against the grid by plan()."""

    command = "attend"
    needs_classes = False

    def __init__(
        self,
        view: View,
        block: int | None,
        head: int | None,
        all_heads: bool,
        query: str,
        head_fusion: str,
        discard_ratio: float,
        top_k: int | None,
        scale: str = Scale.own.value,
        pool: bool = False,
        planned: AttendPlan | None = None,
    ):
        self.view = view
        self.pool = pool  # the attention pooling's attention over the final rows instead of a block's
        self.block, self.head, self.all_heads = block, head, all_heads
        self.query_text = query
        self.head_fusion, self.discard_ratio = head_fusion, discard_ratio
        self.top_k = top_k
        self.scale = scale  # the figures' colour range: the maps' own, or from zero
        self._planned = planned

    def plan(self, architecture: Any) -> AttendJob:
        return AttendJob(
            self.view,
            self.block,
            self.head,
            self.all_heads,
            self.query_text,
            self.head_fusion,
            self.discard_ratio,
            self.top_k,
            self.scale,
            self.pool,
            self._resolve(architecture),
        )

    def _resolve(self, architecture: Any) -> AttendPlan:
        from vitcli.experiments import attention
        from vitcli.experiments.rollout import check_rollout_options

        grid, num_heads = architecture.grid, architecture.num_heads
        if self.pool:
            from vitcli.loading import require_vit

            # The pooling's heads, read from the skeleton: they need not be the blocks' heads.
            pool_heads = require_vit(architecture.name).attn_pool.num_heads
            top_k = fitted_count("--top-k", self.top_k, DEFAULT_TOP_K, grid.num_tokens, "the model's tokens")
            heads = attention.resolve_heads(pool_heads, self.head, self.all_heads or self.head is None)
            return AttendPlan(top_k, heads=tuple(heads))
        blocks: list[int] = []
        heads = []
        if architecture.staged:
            # Swin: every stage has its own grid, so a query is a patch of one block's stage grid.
            refuse_across_stages(self.view, architecture)
            blocks = attention.resolve_blocks(architecture.depth, self.block, False)
            place = architecture.place(blocks[0])
            grid, num_heads = place.grid, place.heads
        top_k = fitted_count("--top-k", self.top_k, DEFAULT_TOP_K, grid.num_tokens, "the model's tokens")
        query = None
        if not (self.view is View.summary and self.query_text.strip().lower() == "all"):
            query = attention.parse_query(grid, self.query_text)
        if self.view is View.rollout:
            check_rollout_options(self.head_fusion, self.discard_ratio)
        if self.view in (View.map, View.all_blocks):
            blocks = attention.resolve_blocks(architecture.depth, self.block, self.view is View.all_blocks)
            heads = attention.resolve_heads(num_heads, self.head, self.all_heads)
        return AttendPlan(top_k, query, tuple(blocks), tuple(heads))

    def uses(self) -> tuple[str, ...]:
        if self.pool:
            return ("attend --pool",)
        return ("attend",) if self.view is View.map else (f"attend --view {self.view.value}",)

    def name(self) -> str:
        planned = self.planned
        query = setting("q", "all" if planned.query is None else _query_part(planned.query))
        top_k = setting("k", planned.top_k if planned.top_k != DEFAULT_TOP_K else None)
        scale = setting("sc", self.scale if self.scale != Scale.own.value else None)
        if self.pool:
            return result_name("pool-attention", setting("h", self.head or "all"), top_k, scale)
        if self.view is View.summary:
            return result_name("attention-summary", query, scale)
        if self.view is View.rollout:
            fusion, discard = setting("f", self.head_fusion), setting("d", float(self.discard_ratio))
            return result_name("rollout", fusion, discard, query, top_k, scale)
        blocks = setting("b", "all" if self.view is View.all_blocks else self.block)
        heads = setting("h", "all" if self.all_heads else self.head)
        return result_name("attention", blocks, heads, query, top_k, scale)

    def settings(self) -> dict[str, Any]:
        planned = self.planned
        heads, blocks = list(planned.heads), list(planned.blocks)
        if self.pool:
            return {"view": "pool", "heads": heads, "top_k": planned.top_k, "scale": self.scale}
        query = planned.query
        chosen: dict[str, Any] = {
            "view": self.view.value,
            "query": "all" if query is None else query.name,
            "query_token": None if query is None else query.token,
            "scale": self.scale,
        }
        if self.view in (View.map, View.all_blocks):
            chosen |= {"blocks": blocks, "heads": heads, "top_k": planned.top_k}
        if self.view is View.rollout:
            chosen |= {"head_fusion": self.head_fusion, "discard_ratio": self.discard_ratio, "top_k": planned.top_k}
        return chosen

    def compute(self, work: ImageWork) -> Any:
        model, images, planned = work.model, [work.image], self.planned
        if self.pool:
            from vitcli.experiments.attention_pool import pool_attention

            (result,) = pool_attention(model, images, list(planned.heads), planned.top_k)
            return result
        from vitcli.experiments.attention import require_attention

        # A model whose attention cannot be read fails here, before any forward.
        require_attention(model)
        if self.view is View.summary:
            from vitcli.experiments.attention_summary import summarize

            (result,) = summarize(model, images, planned.query)
        elif self.view is View.rollout:
            from vitcli.experiments.rollout import rollout

            (result,) = rollout(model, images, planned.query, self.head_fusion, self.discard_ratio, planned.top_k)
        else:
            from vitcli.experiments.attention import attend

            blocks, heads = list(planned.blocks), list(planned.heads)
            (result,) = attend(model, images, planned.query, blocks, heads, planned.top_k)
        return result

    def present(self, result: Any) -> Presentation:
        from vitcli.presentation import attention, attention_pool, attention_summary, rollout

        view = {View.summary: attention_summary, View.rollout: rollout}.get(self.view, attention)
        view = attention_pool if self.pool else view
        return Presentation(
            view.table(result),
            view.rows(result),
            view.document(result),
            figure=lambda: view.figure(result, self.scale),
            summary=view.summary(result),
        )


def refuse_across_stages(view: View, architecture: Any) -> None:
    """Views that follow one query through blocks on one token grid cannot cross Swin's stages."""
    grids = ", ".join(dict.fromkeys(f"{place.grid.rows}x{place.grid.cols}" for place in architecture.places))
    if view is View.rollout:
        raise UsageError(
            "rollout multiplies attention across blocks on one token grid; Swin's stages have different grids "
            f"({grids})"
        )
    if view is not View.map:
        raise UsageError(
            f"--view {view.value} follows a query through every block on one token grid; the stages of "
            f"{architecture.name} have different grids ({grids}): use --view map --block B"
        )


def _query_part(query: Any) -> str:
    """A query in a file name: the patch number (74), or the prefix token's name in lower case (cls)."""
    return str(query.patch) if query.patch is not None else query.name.lower()


@builds_jobs("attend")
def attend_jobs(
    view: Annotated[
        View,
        typer.Option(
            help="map: one block (--block) and head (--head or --all-heads); all-blocks: the query through every "
            "block; summary: one row per block x head; rollout: attention rollout through every block."
        ),
    ] = View.map,
    block: Annotated[int | None, typer.Option(help="Block, counted from 1 (--view map).", show_default=False)] = None,
    head: Annotated[int | None, typer.Option(help="Head, counted from 1.", show_default=False)] = None,
    all_heads: Annotated[
        bool, typer.Option("--all-heads", help="Every head (--view map or all-blocks), on one common scale.")
    ] = False,
    query: Annotated[
        str,
        typer.Option(
            help="Query token: a patch (74, P74), a zero-based grid position (r5c3), cls; 'all' with --view summary."
        ),
    ] = "cls",
    head_fusion: Annotated[
        HeadFusion | None,
        typer.Option(help="How rollout fuses the heads (default mean).", show_default=False, rich_help_panel=_ROLLOUT),
    ] = None,
    discard_ratio: Annotated[
        float | None,
        typer.Option(
            help="Rollout: share of each row's smallest entries set to 0, CLS kept (default 0).",
            show_default=False,
            rich_help_panel=_ROLLOUT,
        ),
    ] = None,
    top_k: Annotated[
        int | None,
        typer.Option(
            "--top-k",
            "-k",
            help=f"How many top sources the table lists (default {DEFAULT_TOP_K}, or the model's tokens if fewer).",
            show_default=False,
        ),
    ] = None,
    scale: Annotated[
        Scale,
        typer.Option(
            "--scale",
            help="Colour range of the figures: own (each figure's smallest to largest patch value, so near-uniform "
            "rows show their structure) or zero (from 0). The colour bar says which.",
        ),
    ] = Scale.own,
    pool: Annotated[
        bool,
        typer.Option(
            "--pool",
            help="The attention pooling's attention (SigLIP's 'map' head) over the final rows, per head (--head "
            "selects one; default every head).",
        ),
    ] = False,
) -> list[Job]:
    """Refuse options the view does not use (no model needed), then one job for the view."""
    views = [choice.value for choice in View]
    if view not in views:
        raise UsageError(f"--view must be one of {', '.join(views)}, not {view}")
    view = View(view)
    if pool:
        refuse_with_pool(view, block, query)
    given = [name for name, present in (("--block", block is not None), ("--head", head is not None)) if present]
    given += ["--all-heads"] if all_heads else []
    if view is View.summary and given:
        raise UsageError(f"--view summary covers every block and head: drop {', '.join(given)}")
    if view is View.rollout and given:
        raise UsageError(f"--view rollout fuses the heads of every block: drop {', '.join(given)}")
    if view is View.all_blocks and block is not None:
        raise UsageError(f"--view all-blocks covers every block: drop --block {block}")
    if view is not View.rollout and (head_fusion is not None or discard_ratio is not None):
        raise UsageError("--head-fusion and --discard-ratio only apply to --view rollout")
    if query.strip().lower() == "all" and view is not View.summary:
        raise UsageError("--query all only works with --view summary; otherwise give one query (a patch, r5c3 or cls)")
    scales = [choice.value for choice in Scale]
    if str(scale) not in scales:
        raise UsageError(f"--scale must be one of {', '.join(scales)}, not {scale}")
    fusion = str(head_fusion or HeadFusion.mean)
    return [AttendJob(view, block, head, all_heads, query, fusion, discard_ratio or 0.0, top_k, str(scale), pool)]


def refuse_with_pool(view: View, block: int | None, query: str) -> None:
    """--pool shows the attention pooling's latent query over the final rows: no view, block or query of a block."""
    if view is not View.map:
        raise UsageError(f"--pool shows the attention pooling's attention: drop --view {view.value}")
    if block is not None:
        raise UsageError(f"--pool reads the attention pooling after the last block: drop --block {block}")
    if query.strip().lower() != "cls":
        raise UsageError(f"--pool's query is the pooling's latent query: drop --query {query}")
