from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from vitcli.errors import UsageError
from vitcli.shell import CommandContext, ImagesArgument, vitcli_command


class HeadFusion(str, Enum):
    mean = "mean"
    max = "max"
    min = "min"


_ROLLOUT = "Rollout options"


@vitcli_command("attend")
def attend_command(
    context: CommandContext,
    images: ImagesArgument = None,
    block: Annotated[int | None, typer.Option(help="Block, counted from 1.", show_default=False)] = None,
    head: Annotated[int | None, typer.Option(help="Head, counted from 1.", show_default=False)] = None,
    query: Annotated[
        str,
        typer.Option(
            help="Query token: a patch (74, P74), a zero-based grid position (r5c3), cls; 'all' with --summary."
        ),
    ] = "cls",
    all_heads: Annotated[
        bool,
        typer.Option("--all-heads", help="Every head of the block, on one common scale."),
    ] = False,
    all_blocks: Annotated[bool, typer.Option("--all-blocks", help="The same query through every block.")] = False,
    summary: Annotated[
        bool,
        typer.Option(
            "--summary",
            help="One row per block x head: CLS mass, entropy, mean distance, top source.",
        ),
    ] = False,
    rollout: Annotated[
        bool,
        typer.Option(
            "--rollout",
            help="Attention rollout through every block (not a single head's weights).",
            rich_help_panel=_ROLLOUT,
        ),
    ] = False,
    head_fusion: Annotated[
        HeadFusion | None,
        typer.Option(
            help="How rollout fuses the heads (default mean).",
            show_default=False,
            rich_help_panel=_ROLLOUT,
        ),
    ] = None,
    discard_ratio: Annotated[
        float | None,
        typer.Option(
            help="Rollout: share of each row's smallest weights set to 0, CLS kept (default 0).",
            show_default=False,
            rich_help_panel=_ROLLOUT,
        ),
    ] = None,
    top_k: Annotated[int, typer.Option("--top-k", "-k", help="How many top sources the table lists.")] = 10,
) -> None:
    """Exact attention weights of one query for any block and head: table, maps, summaries and rollout.

    The weights are softmax(q k^T * scale) over all tokens (CLS included), never renormalized; nothing is printed unless the explicit computation reproduces the model's own attention output.
    """
    from vitcli import attend as core
    from vitcli.output import run_document, write_csv, write_figure, write_json

    _check_combinations(
        block,
        head,
        query,
        all_heads,
        all_blocks,
        summary,
        rollout,
        head_fusion,
        discard_ratio,
    )
    paths = context.images(images)
    model = context.model()
    model.require_standard_blocks()
    everyone = summary and query.strip().lower() == "all"
    chosen = None if everyone else core.parse_query(model.grid, query)
    if summary:
        results = core.summarize(model, paths, chosen)
    elif rollout:
        fusion = (head_fusion or HeadFusion.mean).value
        results = core.rollout(model, paths, chosen, fusion, discard_ratio or 0.0, top_k)
    else:
        blocks = core.resolve_blocks(model, block, all_blocks)
        heads = core.resolve_heads(model, head, all_heads)
        results = core.attend(model, paths, chosen, blocks, heads, top_k)
    provenance = context.provenance(model)
    for result, folder in zip(results, context.image_directories(paths)):
        if summary:
            written = [
                write_csv(folder / "summary.csv", result.rows()),
                write_json(folder / "summary.json", run_document([result], provenance)),
            ]
        elif rollout:
            written = [
                write_csv(folder / "rollout.csv", result.rows()),
                write_json(folder / "rollout.json", run_document([result], provenance)),
                write_figure(folder / "rollout.png", core.rollout_figure(result)),
            ]
        else:
            written = [
                write_csv(folder / "attention.csv", result.rows()),
                write_json(folder / "attention.json", run_document([result], provenance)),
                write_figure(folder / "attention.png", core.attention_figure(result)),
            ]
        context.output.wrote(written)
    context.output.emit(results, provenance)


def _check_combinations(
    block: int | None,
    head: int | None,
    query: str,
    all_heads: bool,
    all_blocks: bool,
    summary: bool,
    rollout: bool,
    head_fusion: HeadFusion | None,
    discard_ratio: float | None,
) -> None:
    """Refuse option combinations that mean nothing, before the model is loaded."""
    chosen = [
        name
        for name, given in (
            ("--block", block is not None),
            ("--head", head is not None),
            ("--all-heads", all_heads),
            ("--all-blocks", all_blocks),
        )
        if given
    ]
    if summary and rollout:
        raise UsageError("--summary and --rollout are two different views: choose one")
    if summary and chosen:
        raise UsageError(f"--summary covers every block and head: drop {', '.join(chosen)}")
    if rollout and chosen:
        raise UsageError(f"--rollout fuses the heads of every block: drop {', '.join(chosen)}")
    if not rollout and (head_fusion is not None or discard_ratio is not None):
        raise UsageError("--head-fusion and --discard-ratio only apply with --rollout")
    if query.strip().lower() == "all" and not summary:
        raise UsageError("--query all only works with --summary; otherwise give one query (a patch, r5c3 or cls)")
