"""`vitcli bench` as tables, rows, JSON and figures: one image's scores, and the leaderboard over images. Nothing here
recomputes a number: the leaderboard's rows come from vitcli.experiments.bench."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from vitcli.experiments.bench import CONFIDENCE, SCORE_BY_NAME, LeaderboardRow
from vitcli.presentation.common import method_column

RANDOM_BASELINE = "random"  # the random-map baseline: drawn apart in the figure


def image_table(scores: dict[str, dict[str, float]], unavailable: dict[str, str], label: str) -> Table:
    names = [name for name in SCORE_BY_NAME if any(name in values for values in scores.values())]
    table = Table(title=f"bench scores of {label}", caption=_not_run(unavailable))
    table.add_column("method")
    for name in names:
        table.add_column(f"{name} ({_better(name)})", justify="right")
    for method, values in scores.items():
        table.add_row(method, *(f"{values[name]:.4g}" if name in values else "-" for name in names))
    return table


def image_rows(scores: dict[str, dict[str, float]], unavailable: dict[str, str]) -> list[dict[str, Any]]:
    rows = [
        {"method": method, "score": name, "value": value, "reason": ""}
        for method, values in scores.items()
        for name, value in values.items()
    ]
    return rows + [{"method": method, "score": "", "value": None, "reason": why} for method, why in unavailable.items()]


def image_summary(scores: dict[str, dict[str, float]]) -> dict[str, float]:
    return {
        f"bench_{method_column(method)}_{name}": value
        for method, values in scores.items()
        for name, value in values.items()
    }


def _better(score: str) -> str:
    return "higher is better" if SCORE_BY_NAME[score].higher_better else "lower is better"


def _not_run(unavailable: dict[str, str]) -> str | None:
    if not unavailable:
        return None
    return "not run: " + "; ".join(f"{method}: {why}" for method, why in unavailable.items())


def leaderboard_rows(rows: Sequence[LeaderboardRow]) -> list[dict[str, Any]]:
    return [
        {
            "score": row.score,
            "rank": row.rank,
            "method": row.method,
            "images": row.images,
            "mean": row.mean,
            "low": row.low,
            "high": row.high,
            "better": _better(row.score) if row.score else "",
            "reason": row.reason,
        }
        for row in rows
    ]


def leaderboard_table(rows: Sequence[LeaderboardRow]) -> Table:
    images = max((row.images for row in rows), default=0)
    table = Table(
        title=f"bench leaderboard over {images} images: mean [{CONFIDENCE:.0%} bootstrap interval], ranked per score",
        caption="the scores' definitions: docs/commands/bench.md and the leaderboard's JSON",
    )
    for column in ("score", "rank", "method", "images", "mean [interval]"):
        table.add_column(column, justify="right" if column in ("rank", "images") else "left")
    for row in rows:
        if row.score:
            interval = f"{row.mean:.4g} [{row.low:.4g}, {row.high:.4g}]"
            table.add_row(f"{row.score} ({_better(row.score)})", str(row.rank), row.method, str(row.images), interval)
        else:
            table.add_row("-", "-", row.method, "0", f"not run: {row.reason}")
    return table


def leaderboard_document(rows: Sequence[LeaderboardRow], images: int) -> dict[str, Any]:
    """The JSON body; `audits.leaderboard` is what the report draws as a table (vitcli.report.audits)."""
    listed = leaderboard_rows(rows)
    definition = (
        f"per score and method: mean over the images and the {CONFIDENCE:.0%} percentile bootstrap interval of the "
        "mean (2000 resamples, seed 0, values sorted first); rank 1 is the best mean; "
        + "; ".join(f"{score.name}: {score.what}" for score in SCORE_BY_NAME.values())
    )
    return {
        "images": images,
        "leaderboard": listed,
        "audits": {"leaderboard": {"definition": definition, "confidence": CONFIDENCE, "methods": listed}},
    }


def leaderboard_figure(rows: Sequence[LeaderboardRow], weights: str) -> Any:
    """One panel per score: each method's mean with its bootstrap interval, best first (the random baseline gray)."""
    from vitcli import figures

    scored = [row for row in rows if row.score]
    names = list(dict.fromkeys(row.score for row in scored))
    columns = min(3, max(1, len(names)))
    lines = -(-len(names) // columns) if names else 1
    methods = max((sum(1 for row in scored if row.score == name) for name in names), default=1)
    fig, panels = figures.plt.subplots(
        lines, columns, figsize=(4.2 * columns, (0.32 * methods + 1.4) * lines), layout="constrained", squeeze=False
    )
    for panel in panels.flat[len(names) :]:
        panel.set_visible(False)
    for panel, name in zip(panels.flat, names, strict=False):
        mine = [row for row in scored if row.score == name]
        positions = list(range(len(mine)))
        means = [row.mean for row in mine]
        errors = [[row.mean - row.low for row in mine], [row.high - row.mean for row in mine]]
        colours = ["tab:gray" if row.method == RANDOM_BASELINE else "tab:blue" for row in mine]
        panel.barh(positions, means, xerr=errors, color=colours, capsize=3)
        panel.set_yticks(positions, [row.method for row in mine], fontsize=8)
        panel.invert_yaxis()
        for position, row in zip(positions, mine, strict=True):
            panel.text(row.high, position, f"  {row.mean:.3g}", va="center", fontsize=7)  # beyond the interval
        low, high = min(row.low for row in mine), max(row.high for row in mine)
        reach = max(abs(low), abs(high)) or 1.0  # all zero (an untrained model's pointing game): a unit axis
        panel.set_xlim(min(0.0, low) - 0.05 * reach, max(0.0, high) + 0.3 * reach)
        panel.set_title(f"{name} ({_better(name)})", fontsize=9)
    images = max((row.images for row in scored), default=0)
    figures.title(fig, f"bench over {images} images: mean and {CONFIDENCE:.0%} bootstrap interval", weights)
    return fig
