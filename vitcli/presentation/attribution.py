"""Direct logit attribution as a table, CSV rows, JSON, figures (bars and a heads heat map, or per-head token maps)
and a summary."""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.table import Table
from rich.text import Text

from vitcli.experiments.attribution import (
    ATTENTION,
    EMBEDDING,
    MLP,
    POOL_MLP,
    RECONSTRUCTION_TOLERANCE,
    TOKEN,
    AttributionResult,
    Term,
)
from vitcli.experiments.results import EmbeddingScore
from vitcli.render import weights_caption

DEFINITION = (
    "metric = target logit (minus the contrast's); final rows = embedding + every block's attention and MLP outputs "
    "(layer scale applied) and attention = sum of heads + bias; with the final LayerNorm's scale frozen at this "
    "image's value, metric = sum of terms + constant (LayerNorm bias and head bias)"
)
# What an embedding target's metric reads (vitcli.experiments.attribution): the terms add up to its score.
EMBEDDING_READOUT = {
    "image": "pooled embedding . (REF's embedding / |REF's embedding|) / |pooled embedding|, the image's embedding "
    "norm frozen at its value: the cosine similarity",
    "direction": "pooled embedding . direction",
    "feature": "pooled embedding . unit vector of the feature",
    "text": "pooled embedding . scale x (text's unit embedding - contrast_text's, if any) / |pooled embedding|, the "
    "image's embedding norm frozen at its value: the scaled cosine",
}
SHOWN_TOKENS = 12  # the table's share of --by token: the largest source-token terms


# On Swin (first_block > 1) the decomposition starts at the last stage: patch merging before it is not linear.
EVERY_BLOCK = "final rows = embedding + every block's attention and MLP outputs"
LAST_STAGE = (
    "final rows = the rows entering block {first} (the last stage's input, after patch merging) + the attention and "
    "MLP outputs of blocks {first}..{depth}"
)
EARLIER_STAGES = (
    "; earlier blocks reach the last stage only through patch merging (a LayerNorm and a Linear), which is not "
    "linear, so they have no terms of their own"
)


ATTENTION_POOLING = (
    "; attention pooling with its probabilities frozen at this image's values reads each row through its v and "
    "output projections, and its residual MLP is one term (pool mlp)"
)


def _definition(result: AttributionResult) -> str:
    if result.pool_mlp is not None:
        return DEFINITION + ATTENTION_POOLING
    if result.first_block == 1:
        return DEFINITION
    depth = result.first_block + len(result.bias_terms) - 1
    staged = DEFINITION.replace(EVERY_BLOCK, LAST_STAGE.format(first=result.first_block, depth=depth))
    return staged + EARLIER_STAGES


def _entering(result: AttributionResult) -> str:
    """The first term's name: the embedding, or the rows entering the first decomposed block."""
    return EMBEDDING if result.first_block == 1 else f"entering {result.first_block}"


def _metric_text(result: AttributionResult) -> str:
    if isinstance(result.target, EmbeddingScore):
        return f"{result.target.target.unit} ({result.target.label})"
    target = f"{result.target.index} {result.target.label.split(',')[0]}"
    if result.contrast is None:
        return f"logit of {target}"
    return f"logit of {target} - logit of {result.contrast.index} {result.contrast.label.split(',')[0]}"


def _check_text(result: AttributionResult) -> str:
    return (
        f"sum of terms + constant {result.constant:.6g} = {result.reconstruction:.6g}; "
        f"model: {result.model_metric:.6g}; "
        f"|difference| {result.difference:.2g} (at most {RECONSTRUCTION_TOLERANCE:g})"
    )


def component_name(term: Term, token_names: tuple[str, ...]) -> str:
    """4.attn, 4.mlp, 4.2 (head 2 of block 4), 4.bias, 4.2.P63, embedding, pool mlp."""
    if term.component in (EMBEDDING, POOL_MLP):
        return term.component
    if term.component in (ATTENTION, MLP):
        return f"{term.block}.{term.component}"
    if term.component == TOKEN:
        return f"{term.block}.{term.head}.{token_names[term.token]}"
    return f"{term.block}.{term.head}" if term.head is not None else f"{term.block}.bias"


def table(result: AttributionResult) -> Table:
    view = Table(
        title=f"{result.source.display_path}\ndirect logit attribution of the {_metric_text(result)}, by {result.by}",
        caption=Text.assemble(f"{_definition(result)}\n{_check_text(result)}\n", weights_caption(result.weights_label)),
    )
    embedding = result.block_terms[0].value
    if result.by == "block":
        for column in ("block", "attn", "mlp"):
            view.add_column(column, justify="right")
        view.add_row(_entering(result), f"{embedding:.4g}", "")
        for index in range(1, len(result.bias_terms) + 1):
            view.add_row(
                str(result.first_block + index - 1),
                *(f"{term.value:.4g}" for term in result.block_terms[2 * index - 1 : 2 * index + 1]),
            )
        if result.pool_mlp is not None:
            view.add_row(POOL_MLP, "", f"{result.pool_mlp:.4g}")
        return view
    if result.by == "head":
        heads = result.head_terms.shape[1]
        for column in ("block", *(f"head {h}" for h in range(1, heads + 1)), "attn bias", "mlp"):
            view.add_column(column, justify="right")
        view.add_row(_entering(result), f"{embedding:.4g}", *[""] * (heads + 1))
        for index, row in enumerate(result.head_terms, start=1):
            mlp = result.block_terms[2 * index].value
            view.add_row(
                str(result.first_block + index - 1),
                *(f"{value:.4g}" for value in row),
                f"{result.bias_terms[index - 1]:.4g}",
                f"{mlp:.4g}",
            )
        if result.pool_mlp is not None:
            view.add_row(POOL_MLP, *[""] * (heads + 1), f"{result.pool_mlp:.4g}")
        return view
    for column in ("source token", "head", "term"):
        view.add_column(column, justify="right")
    tokens = sorted((term for term in result.terms if term.component == TOKEN), key=lambda term: -abs(term.value))
    for term in tokens[:SHOWN_TOKENS]:
        view.add_row(result.token_names[term.token], str(term.head), f"{term.value:.4g}")
    rest = sum(term.value for term in result.terms if term.component != TOKEN)
    view.add_row("...", "", "")
    view.add_row(f"all {len(tokens)} token terms", "", f"{sum(term.value for term in tokens):.4g}")
    view.add_row("every other component", "", f"{rest:.4g}")
    return view


def rows(result: AttributionResult) -> list[dict[str, Any]]:
    return [
        {
            "component": term.component,
            "name": _entering(result) if term.component == EMBEDDING else component_name(term, result.token_names),
            "block": term.block,
            "head": term.head,
            "token": term.token,
            "token_name": None if term.token is None else result.token_names[term.token],
            "target_class": _target_cell(result),
            "contrast_class": None if result.contrast is None else result.contrast.index,
            "term": term.value,
        }
        for term in result.terms
    ]


def document(result: AttributionResult) -> dict[str, Any]:
    def described(chosen: Any) -> dict[str, Any] | None:
        if chosen is None:
            return None
        if isinstance(chosen, EmbeddingScore):
            return {**chosen.to_json(), "readout": EMBEDDING_READOUT[chosen.kind]}
        return {"kind": "class", "class_index": chosen.index, "label": chosen.label, "probability": chosen.probability}

    return {
        "weights": result.weights_label,
        "definition": _definition(result),
        "by": result.by,
        "first_block": result.first_block,
        "block": result.block,
        "target": described(result.target),
        "contrast": described(result.contrast),
        "reconstruction": {
            "model_metric": result.model_metric,
            "constant": result.constant,
            "sum_of_terms_plus_constant": result.reconstruction,
            "abs_difference": result.difference,
            "tolerance": RECONSTRUCTION_TOLERANCE,
        },
        "pool_mlp_term": result.pool_mlp,
        "terms": [{key: value for key, value in row.items() if not key.endswith("_class")} for row in rows(result)],
        "head_terms": result.head_terms.tolist(),
        "attention_bias_terms": result.bias_terms.tolist(),
    }


def figure(result: AttributionResult) -> Any:
    from vitcli import figures

    fig = _token_figure(result) if result.by == TOKEN else _block_figure(result)
    figures.title(
        fig,
        f"{result.source.display_name}: direct logit attribution of the {_metric_text(result)}",
        result.weights_label,
    )
    return fig


def _block_figure(result: AttributionResult) -> Any:
    """Bars: the embedding, then attention and MLP side by side per block; heat map: blocks x heads around 0."""
    from vitcli import figures

    depth = result.head_terms.shape[0]
    fig, (bars, heat) = figures.plt.subplots(1, 2, figsize=(13, 4.8), layout="constrained", width_ratios=[2, 1])
    blocks = np.arange(result.first_block, result.first_block + depth)
    attention = [term.value for term in result.block_terms[1::2]]
    mlp = [term.value for term in result.block_terms[2::2]]
    places = np.arange(1, depth + 1)
    entering = "emb" if result.first_block == 1 else f"in {result.first_block}"
    bars.bar([0], [result.block_terms[0].value], 0.7, color="gray", label=_entering(result))
    bars.bar(places - 0.18, attention, 0.36, label="attention")
    bars.bar(places + 0.18, mlp, 0.36, label="MLP")
    ticks = [entering, *(str(block) for block in blocks)]
    if result.pool_mlp is not None:
        bars.bar([depth + 1], [result.pool_mlp], 0.7, color="black", label="pooling MLP")
        ticks.append("pool")
    bars.axhline(0, color="black", linewidth=0.6)
    bars.set_xticks(range(len(ticks)), ticks)
    staged = "" if result.first_block == 1 else "; the last stage: earlier blocks pass through patch merging"
    bars.set_xlabel(f"block (counting from 1{staged})")
    bars.set_ylabel(f"term ({_units(result)})")
    bars.legend(fontsize=8)
    bars.set_title(_check_text(result), fontsize=8)
    image = figures.blocks_map(heat, result.head_terms)
    heat.set_yticks(range(depth), [str(block) for block in blocks])  # from first_block (Swin: the last stage)
    heat.set_title("per-head terms (0 = white)", fontsize=9)
    fig.colorbar(image, ax=heat, shrink=0.85)
    return fig


def _token_figure(result: AttributionResult) -> Any:
    """One map per head of the block over the crop: each patch's term through that head; prefix tokens in the title."""
    from vitcli import figures

    grid, heads = result.grid, result.head_terms.shape[1]
    tokens = [term for term in result.terms if term.component == TOKEN]
    values = np.zeros((heads, len(result.token_names)))
    for term in tokens:
        values[term.head - 1, term.token] = term.value
    prefix = grid.num_prefix
    columns = min(heads, 4)
    fig, panels = figures.figure(columns, 4.0, rows=-(-heads // columns))
    limit = figures.symmetric_limit(values)
    mappable = None
    for head, panel in enumerate(panels[:heads]):
        mappable = figures.overlay(
            panel,
            result.crop,
            values[head, prefix:].reshape(grid.rows, grid.cols),
            figures.DIVERGING,
            -limit,
            limit,
            alpha=0.75,
        )
        named = ", ".join(f"{name} {values[head, index]:.3g}" for index, name in enumerate(result.token_names[:prefix]))
        panel.set_title(f"block {result.block} head {head + 1}: sum {values[head].sum():.3g}\n{named}", fontsize=8)
    for panel in panels[heads:]:
        panel.set_visible(False)
    fig.colorbar(mappable, ax=panels, shrink=0.8, label=f"term through the head ({_units(result)})")
    return fig


def summary(result: AttributionResult) -> dict[str, Any]:
    largest = max(result.terms, key=lambda term: abs(term.value))
    return {
        "attribute_target_class": _target_cell(result),
        "attribute_metric": result.model_metric,
        "attribute_abs_difference": result.difference,
        "attribute_largest_component": component_name(largest, result.token_names),
        "attribute_largest_term": largest.value,
    }


def _target_cell(result: AttributionResult) -> int | str:
    """A CSV cell naming the target: the class index, or the embedding target in a few words."""
    return result.target.label if isinstance(result.target, EmbeddingScore) else result.target.index


def _units(result: AttributionResult) -> str:
    return f"{result.target.target.unit} units" if isinstance(result.target, EmbeddingScore) else "logit units"
