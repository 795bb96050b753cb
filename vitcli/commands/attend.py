"""`vitcli attend`: the Typer command and its options; its Jobs and their builder are vitcli.jobs.attend."""

from __future__ import annotations

from typing import Annotated

import typer

from vitcli.context import CommandContext
from vitcli.jobs.attend import DEFAULT_TOP_K, HeadFusion, Scale, View, attend_jobs
from vitcli.options import ImagesArgument
from vitcli.shell import vitcli_command

_ROLLOUT = "Rollout options"


@vitcli_command(
    "attend",
    examples=[
        "vitcli attend examples/images/newfoundland_31.jpg --block 4 --head 1 --query 74",
        "vitcli attend examples/images/newfoundland_31.jpg --view all-blocks --all-heads --query r5c3",
        "vitcli attend examples/images --view summary --query all --format csv",
    ],
)
def attend_command(
    context: CommandContext,
    images: ImagesArgument = None,
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
) -> None:
    """Exact attention of one query for any block and head: table, maps, summaries and rollout.

    The attention is softmax(q k^T * scale) over all tokens (CLS included), never renormalized; nothing is printed
    unless the explicit computation reproduces the model's own attention output.
    """
    jobs = attend_jobs(view, block, head, all_heads, query, head_fusion, discard_ratio, top_k, scale, pool)
    context.run(jobs, images)
