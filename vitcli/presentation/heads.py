"""TextSpan results: a table per head (its texts and their variance shares), rows, JSON, a blocks x heads figure."""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from vitcli.experiments.heads import EMBEDDING_TOLERANCE, HeadsResult, HeadTexts
from vitcli.filenames import escaped_path
from vitcli.render import weights_caption

ALGORITHM = (
    "TextSpan (Gandelsman et al., ICLR 2024): over the images, each head's direct contribution to the image "
    "embedding, centred; the texts are projected onto the span of its top principal directions, then k times the "
    "text whose remaining vector r maximises the variance of C r is chosen and its direction projected out of the "
    "head's contributions and of every text; share = variance along that direction / the head's total variance"
)
HEAD_TABLE_WIDTH = 64  # characters: room for a head's title on one line
FIGURE_TEXTS = 3  # texts written in each head's cell of the figure
FIGURE_TEXT_WIDTH = 22  # characters per line of a text in a cell


def table(result: HeadsResult) -> Group:
    facts = Table(title=f"heads of {result.model_name} described by texts (TextSpan)", show_header=False)
    facts.caption = weights_caption(result.weights)
    facts.add_column("fact")
    facts.add_column("value")
    facts.add_row("texts", Text(f"{escaped_path(result.bank_path)}: {len(result.texts)} texts ({_embeddings(result)})"))
    left_out = f" ({len(result.skipped)} unreadable, left out)" if result.skipped else ""
    facts.add_row("images", f"{len(result.images)}{left_out}")
    blocks = f"{result.blocks[0]} to {result.blocks[-1]}" if len(result.blocks) > 1 else str(result.blocks[0])
    facts.add_row("blocks", f"{blocks}, {result.heads_per_block} heads each")
    facts.add_row("decomposition", f"parts add up to the embedding within {result.largest_difference:.2g}")
    parts: list[Any] = [facts]
    for head in result.heads:
        shown = Table(title=_head_title(head), title_justify="left", min_width=HEAD_TABLE_WIDTH)
        shown.add_column("#", justify="right")
        shown.add_column("text")
        shown.add_column("share", justify="right")
        shown.add_column("cumulative", justify="right")
        for rank, (index, share, cumulative) in enumerate(_picks(head), start=1):
            shown.add_row(str(rank), Text(result.texts[index]), f"{share:.3f}", f"{cumulative:.3f}")
        parts.append(shown)
    return Group(*parts)


def _head_title(head: HeadTexts) -> str:
    if not head.texts:
        return f"block {head.block}, head {head.head}: no variance the texts can explain"
    texts = "1 text explains" if len(head.texts) == 1 else f"{len(head.texts)} texts explain"
    return f"block {head.block}, head {head.head}: {texts} {head.explained:.1%} of its variance"


def _picks(head: HeadTexts) -> list[tuple[int, float, float]]:
    cumulative = np.cumsum(head.shares).tolist()
    return list(zip(head.texts, head.shares, cumulative, strict=True))


def _embeddings(result: HeadsResult) -> str:
    return "embeddings from an earlier run's cache" if result.text_embeddings_cached else "embeddings computed"


def rows(result: HeadsResult) -> list[dict[str, Any]]:
    return [
        {
            "block": head.block,
            "head": head.head,
            "rank": rank,
            "text": result.texts[index],
            "share": share,
            "cumulative_share": cumulative,
            "head_variance": head.total_variance,
        }
        for head in result.heads
        for rank, (index, share, cumulative) in enumerate(_picks(head), start=1)
    ]


def document(result: HeadsResult) -> dict[str, Any]:
    return {
        "weights": result.weights,
        "model": result.model_name,
        "algorithm": ALGORITHM,
        "texts": {
            "path": escaped_path(result.bank_path),
            "sha256": result.bank_sha256,
            "count": len(result.texts),
            "embeddings": "from the cache" if result.text_embeddings_cached else "computed",
        },
        "k": result.k,
        "blocks": result.blocks,
        "heads_per_block": result.heads_per_block,
        "images": [escaped_path(source.path) for source in result.images],
        "skipped": result.skipped,
        "decomposition": {
            "largest_difference": result.largest_difference,
            "tolerance": EMBEDDING_TOLERANCE,
            "meaning": "over images and coordinates, |sum of every component's direct contribution - the model's "
            "image embedding|",
        },
        "heads": [
            {
                "block": head.block,
                "head": head.head,
                "variance": head.total_variance,
                "explained": head.explained,
                "span_rank": head.rank,
                "texts": [
                    {"rank": rank, "text": result.texts[index], "index": index, "share": share}
                    for rank, (index, share, _) in enumerate(_picks(head), start=1)
                ],
            }
            for head in result.heads
        ],
    }


def figure(result: HeadsResult) -> Any:
    """Blocks x heads: each cell coloured by the share of the head's variance its k texts explain, with its first
    texts and their shares written in it."""
    import matplotlib.pyplot as plt

    from vitcli import figures

    blocks, heads = len(result.blocks), result.heads_per_block
    explained = np.array([head.explained for head in result.heads]).reshape(blocks, heads)
    fig, panel = plt.subplots(figsize=(1.9 * heads + 2.0, 1.5 * blocks + 1.6), layout="constrained")
    image = panel.imshow(explained, cmap="Greens", vmin=0, vmax=1, aspect="auto")
    panel.set_xticks(range(heads), [str(head) for head in range(1, heads + 1)])
    panel.set_yticks(range(blocks), [str(block) for block in result.blocks])
    panel.set_xlabel("head")
    panel.set_ylabel("block")
    for head in result.heads:
        lines = [f"{_shortened(result.texts[index])} {share:.2f}" for index, share, _ in _picks(head)[:FIGURE_TEXTS]]
        dark = head.explained > 0.6
        panel.text(
            head.head - 1, result.blocks.index(head.block), "\n".join(lines), ha="center", va="center", fontsize=6.5,
            color="white" if dark else "black", parse_math=False,
        )  # fmt: skip
    fig.colorbar(image, ax=panel, shrink=0.8, label=f"share of the head's variance its {result.k} texts explain")
    figures.title(fig, f"heads described by texts (TextSpan), {len(result.images)} images ({result.model_name})",
                  result.weights)  # fmt: skip
    return fig


def _shortened(text: str) -> str:
    return text if len(text) <= FIGURE_TEXT_WIDTH else text[: FIGURE_TEXT_WIDTH - 1] + "\u2026"


def summary(result: HeadsResult) -> dict[str, Any]:
    explained = [head.explained for head in result.heads]
    return {
        "heads_described": len(result.heads),
        "heads_images": len(result.images),
        "heads_mean_explained": float(np.mean(explained)) if explained else None,
    }
