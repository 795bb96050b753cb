"""The logit lens as a table, CSV rows, JSON, a line plot through depth and a summary."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from vitcli.experiments.lens import CLS, PATCH_MEAN, LensReadout, LensResult
from vitcli.render import weights_caption

DEFINITION = (
    "after block b: CLS readout = the model's final norm and head on the CLS row; patch mean readout = the same "
    "final norm and head on the mean of the patch rows; the model's own head reads {own} (its last block's readout "
    "is the model's logits)"
)


def _target_text(result: LensResult) -> str:
    target = result.target
    return f"{target.index} {target.label.split(',')[0]} (model p {target.probability:.4g})"


def _top1_text(readout: LensReadout) -> str:
    return f"{readout.top1.index} {readout.top1.label.split(',')[0]} ({readout.top1.probability:.3g})"


def table(result: LensResult) -> Table:
    lens = Table(
        title=f"{result.source.display_path}\nlogit lens for {_target_text(result)}",
        caption=Text.assemble(
            f"{DEFINITION.format(own=result.own_readout)}\nrank 1 = the largest logit; block {result.depth} "
            f"{result.own_readout} readout vs the model's logits: max |difference| {result.final_difference:g}\n",
            weights_caption(result.weights_label),
        ),
    )
    for column in ("block", "CLS target p", "CLS rank", "CLS top-1", "patch mean target p", "rank", "patch mean top-1"):
        lens.add_column(column, justify="left" if "top-1" in column else "right", no_wrap="top-1" in column)
    for cls, mean in zip(result.series(CLS), result.series(PATCH_MEAN), strict=True):
        lens.add_row(
            str(cls.block),
            f"{cls.target_probability:.4g}",
            str(cls.target_rank),
            _top1_text(cls),
            f"{mean.target_probability:.4g}",
            str(mean.target_rank),
            _top1_text(mean),
        )
    return lens


def rows(result: LensResult) -> list[dict[str, Any]]:
    return [
        {
            "block": readout.block,
            "readout": readout.readout,
            "target_class": result.target.index,
            "target_label": result.target.label,
            "target_probability": readout.target_probability,
            "target_rank": readout.target_rank,
            "top1_class": readout.top1.index,
            "top1_label": readout.top1.label,
            "top1_probability": readout.top1.probability,
        }
        for readout in result.readouts
    ]


def document(result: LensResult) -> dict[str, Any]:
    return {
        "weights": result.weights_label,
        "definition": DEFINITION.format(own=result.own_readout),
        "own_readout": result.own_readout,
        "target": {
            "class_index": result.target.index,
            "label": result.target.label,
            "probability": result.target.probability,
        },
        "self_check": {
            "what": (
                f"largest |{result.own_readout} readout after block {result.depth} - the model's logits|; "
                "must be exactly 0"
            ),
            "max_abs_difference": result.final_difference,
        },
        "readouts": [{key: value for key, value in row.items() if key != "target_label"} for row in rows(result)],
    }


def figure(result: LensResult) -> Any:
    """The target's probability and rank after each block, for the CLS row and the patch mean."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    from vitcli import figures

    fig, (probability, rank) = figures.plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    for readout, style in ((CLS, "o-"), (PATCH_MEAN, "s--")):
        series = result.series(readout)
        blocks = [row.block for row in series]
        probability.plot(blocks, [row.target_probability for row in series], style, label=readout)
        rank.plot(blocks, [row.target_rank for row in series], style, label=readout)
    probability.set_ylabel(f"probability of class {result.target.index}")
    probability.set_title("target probability through depth", fontsize=10)
    rank.set_yscale("log")
    # Plain numbers (1, 10, 100), not 10^0, 10^1: a rank is a count.
    rank.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    rank.yaxis.set_minor_formatter(NullFormatter())
    rank.invert_yaxis()
    rank.set_ylabel("rank of the target (1 = top-1; log scale)")
    rank.set_title("target rank through depth", fontsize=10)
    for panel in (probability, rank):
        panel.set_xlabel("after block (counting from 1)")
        panel.set_xticks(range(1, result.depth + 1))
        panel.legend(fontsize=8)
    figures.title(fig, f"{result.source.display_name}: logit lens for {_target_text(result)}", result.weights_label)
    return fig


def summary(result: LensResult) -> dict[str, Any]:
    cls, mean = result.series(CLS), result.series(PATCH_MEAN)
    return {
        "lens_target_class": result.target.index,
        "lens_target_probability": result.target.probability,
        "lens_cls_top1_from_block": _settled_block(cls),
        "lens_patch_mean_final_rank": mean[-1].target_rank,
        "lens_patch_mean_final_probability": mean[-1].target_probability,
    }


def _settled_block(series: list[LensReadout]) -> int | None:
    """The first block from which the target stays the top-1 to the end; None if it is not top-1 at the end."""
    settled = None
    for readout in reversed(series):
        if readout.target_rank != 1:
            break
        settled = readout.block
    return settled
