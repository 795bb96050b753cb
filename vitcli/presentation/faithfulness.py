"""Faithfulness over many images (`MethodSpread`s) as a figure: each method's mean AUC with its spread."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vitcli.experiments.faithfulness import RANDOM, MethodSpread


def spread_figure(spreads: Sequence[MethodSpread], weights: str) -> Any:
    """Deletion and insertion AUCs, mean and sample standard deviation over the images, one bar per method (the
    random baseline in gray): lower deletion and higher insertion AUC are better."""
    from vitcli import figures

    fig, panels = figures.plt.subplots(1, 2, figsize=(9.0, 0.45 * len(spreads) + 2.0), layout="constrained")
    positions = list(range(len(spreads)))
    colours = ["tab:gray" if spread.method == RANDOM else "tab:blue" for spread in spreads]
    images = max(spread.images for spread in spreads)
    for panel, what, means, sds in (
        (panels[0], "deletion AUC (lower is better)", [s.deletion_mean for s in spreads],
         [s.deletion_std for s in spreads]),
        (panels[1], "insertion AUC (higher is better)", [s.insertion_mean for s in spreads],
         [s.insertion_std for s in spreads]),
    ):  # fmt: skip
        panel.barh(positions, means, xerr=sds, color=colours, capsize=3)
        panel.set_yticks(positions, [spread.method for spread in spreads], fontsize=9)
        panel.invert_yaxis()
        reach = max(mean + sd for mean, sd in zip(means, sds, strict=True))
        panel.set_xlim(0, min(1.0, 1.45 * reach) if reach > 0 else 1.0)  # AUCs of probabilities lie in 0..1
        for position, mean, sd in zip(positions, means, sds, strict=True):
            panel.text(mean + sd, position, f"  {mean:.4g}", va="center", fontsize=8)  # beyond the sd line
        panel.set_xlabel(f"{what}; bars: mean, lines: sd over images", fontsize=8)
    figures.title(fig, f"faithfulness over {images} images", weights)
    return fig
