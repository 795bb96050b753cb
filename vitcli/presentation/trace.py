"""The trace as people and scripts read it: a stage table, one line per block, long-form rows, JSON, a depth plot."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Group
from rich.table import Table

from vitcli.experiments.trace import SELF_CHECK_TOLERANCE, TraceResult
from vitcli.experiments.trace_stages import Stage
from vitcli.presentation.predict import top_table
from vitcli.render import weights_caption

PIXEL_STAGES = ("image.decoded", "image.crop")  # shown as 0..255 integers


def table(result: TraceResult) -> Group:
    shown = result.shown_values
    names = ", ".join(token.name for token in result.followed)
    stages = Table(
        title=f"{result.source.display_name}: {result.model_name}, pixels to probabilities (following {names})",
        caption=weights_caption(result.weights),
    )
    stages.add_column("stage")
    stages.add_column("shape", justify="right")
    stages.add_column(f"first {shown} values")
    stages.add_column("max |Δ| vs timm", justify="right")
    block = None
    for stage in result.stages:
        if stage.block != block:
            stages.add_section()
            block = stage.block
        label = stage.name if stage.block is None else f"block {stage.block}: {stage.name}"
        shape = "x".join(str(size) for size in stage.shape)
        stages.add_row(label, shape, _values_cell(stage, shown), _error(stage.error))
    parts: list[Any] = [stages, _blocks_table(result), top_table(result.top, "softmax of the logits: top classes")]
    parts.append(
        f"check: largest |explicit - timm module (forward hooks, fused attention)| over every kept value "
        f"{result.max_error:.3g}; largest |reconstructed logits - model(x)| {result.logits_error:.3g} "
        f"(tolerance {SELF_CHECK_TOLERANCE:g})"
    )
    return Group(*parts)


def _values_cell(stage: Stage, shown: int) -> str:
    if stage.rows is None:
        return _numbers(stage.values[:shown], stage.key)
    if not stage.rows:
        return "(no followed token has a row here)"
    width = max(len(name) for name in stage.rows)
    return "\n".join(f"{name:<{width}} {_numbers(row[:shown], stage.key)}" for name, row in stage.rows.items())


def _numbers(values: list[float], key: str) -> str:
    if key in PIXEL_STAGES:
        return " ".join(f"{value:.0f}" for value in values)
    return " ".join(f"{value:+.4g}" for value in values)


def _error(error: float | None) -> str:
    return "" if error is None else f"{error:.2g}"


def _blocks_table(result: TraceResult) -> Table:
    blocks = Table(title="one line per block: norm of each followed row leaving it, cosine with the row entering it")
    blocks.add_column("block", justify="right")
    for token in result.followed:
        blocks.add_column(f"{token.name} norm", justify="right")
        blocks.add_column(f"{token.name} cos", justify="right")
    blocks.add_column("max |Δ| vs block output", justify="right")
    embedding = ["input"]
    for token in result.followed:
        embedding += [f"{result.embedding_norms[token.name]:.3f}", ""]
    blocks.add_row(*embedding, "")
    for summary in result.blocks:
        cells = [str(summary.block) + (" (opened)" if summary.block in result.opened_blocks else "")]
        for token in result.followed:
            cells += [f"{summary.norms[token.name]:.3f}", f"{summary.cosine_to_previous[token.name]:.4f}"]
        blocks.add_row(*cells, _error(summary.error))
    return blocks


def rows(result: TraceResult) -> list[dict[str, Any]]:
    """One row per stage and followed token, then one per block and token; the first `shown_values` values."""
    shown = result.shown_values
    table_rows = []

    def row(stage, name, block, head, token, shape, values, norm, cosine, error) -> dict[str, Any]:
        entry = {"stage": stage, "name": name, "block": block, "head": head, "token": token, "shape": shape}
        entry.update({"norm": norm, "cosine_to_previous": cosine, "max_abs_error": error})
        entry.update({f"value_{index}": value for index, value in enumerate(values[:shown])})
        entry.update({f"value_{index}": None for index in range(len(values[:shown]), shown)})
        return entry

    for stage in result.stages:
        shape = "x".join(str(size) for size in stage.shape)
        vectors = stage.rows if stage.rows is not None else {"": stage.values}
        for token, values in vectors.items():
            norm = math.sqrt(sum(value * value for value in values)) if stage.rows is not None else None
            table_rows.append(row(stage.key, stage.name, stage.block, stage.head, token, shape, values, norm, None,
                                  stage.error))  # fmt: skip
    for summary in result.blocks:
        for token, values in summary.output_rows.items():
            table_rows.append(
                row(f"block{summary.block}.summary", "row leaving the block", summary.block, None, token,
                    str(len(values)), values, summary.norms[token], summary.cosine_to_previous[token], summary.error)
            )  # fmt: skip
    return table_rows


def document(result: TraceResult) -> dict[str, Any]:
    """Full vectors of every followed row; stages that are not per token keep their values (images: the first)."""
    return {
        "weights": result.weights,
        "followed": [{"token": t.token, "name": t.name, "patch": t.patch} for t in result.followed],
        "opened_blocks": result.opened_blocks,
        "pooling": result.pooling,
        "stages": [
            {
                "key": stage.key,
                "name": stage.name,
                "shape": list(stage.shape),
                "block": stage.block,
                "head": stage.head,
                "checked_against": stage.module,
                "max_abs_error": stage.error,
                **({"rows": stage.rows} if stage.rows is not None else {"values": stage.values}),
                **({} if stage.rows is not None else {"values_complete": len(stage.values) == math.prod(stage.shape)}),
            }
            for stage in result.stages
        ],
        "embedding_norms": result.embedding_norms,
        "blocks": [
            {
                "block": summary.block,
                "output_rows": summary.output_rows,
                "norms": summary.norms,
                "cosine_to_previous": summary.cosine_to_previous,
                "max_abs_error": summary.error,
            }
            for summary in result.blocks
        ],
        "cls_cosine_to_block1": result.cls_cosine_to_block1,
        "top": [vars(entry) for entry in result.top],
        "checks": {
            "max_abs_error_vs_forward_hooks": result.max_error,
            "max_abs_error_logits_vs_model": result.logits_error,
            "tolerance": SELF_CHECK_TOLERANCE,
        },
    }


def figure(result: TraceResult) -> Any:
    """Norm of each followed row through the depth; the CLS row's cosine with its state after block 1."""
    from matplotlib.ticker import AutoLocator, MaxNLocator

    from vitcli import figures

    fig, (norms, cosines) = figures.figure(2, size=4.5)
    depth = len(result.blocks)
    for panel in (norms, cosines):
        panel.xaxis.set_major_locator(MaxNLocator(integer=True))
        panel.yaxis.set_major_locator(AutoLocator())
        panel.grid(alpha=0.3)
    for token in result.followed:
        values = [result.embedding_norms[token.name]] + [summary.norms[token.name] for summary in result.blocks]
        norms.plot(range(depth + 1), values, marker="o", markersize=3, label=f"{token.name} (token {token.token})")
    norms.set_xlabel("block (0 = rows entering block 1)")
    norms.set_ylabel("L2 norm of the row")
    norms.legend(fontsize=8)
    cosines.plot(range(1, depth + 1), result.cls_cosine_to_block1, marker="o", markersize=3, color="black")
    cosines.set_xlabel("block")
    cosines.set_ylabel("cosine with the CLS row leaving block 1")
    figures.title(
        fig, f"{result.source.display_name}: {result.model_name}, followed rows through the depth", result.weights
    )
    return fig


def summary(result: TraceResult) -> dict[str, Any]:
    best = result.top[0]
    return {
        "trace_top1_class": best.index,
        "trace_top1_label": best.label,
        "trace_top1_probability": best.probability,
        "trace_cls_cosine_last_vs_block1": result.cls_cosine_to_block1[-1],
        "trace_max_abs_error": max(result.max_error, result.logits_error),
    }
