"""explain's `dla` map: each patch's direct contribution to the target through every block's attention heads.

Direct logit attribution (vitcli.experiments.attribution) writes the target logit (or target - contrast, or an
embedding target's score) as a sum of what each component wrote into the final rows, the final LayerNorm's scale
frozen. Every block's head terms split further by source token: head h of block B moves source j's value v_j into
row r with weight A_h[r, j], so source j's part is sum over r of A_h[r, j] (v_j W_O,h^T) . direction_r (attribute
--by token). The map is, per patch, that part summed over heads and blocks. With the prefix tokens' parts, the
embedding's term, every block's attention-bias and MLP terms and the readout's constant it rebuilds the model's
own metric exactly; the result carries that identity, checked like attribute's (RECONSTRUCTION_TOLERANCE).

One forward captures every block's attention pattern and values (on families vitcli writes out, norm1's output,
from which the attention is recomputed as attribute does); no backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vitcli.capture import caching
from vitcli.errors import VitcliError
from vitcli.experiments.attribution import RECONSTRUCTION_TOLERANCE, token_parts, token_sites
from vitcli.experiments.readout import linear_readout
from vitcli.model import PreparedImage, VitModel
from vitcli.targets import BoundTarget, output_of


@dataclass
class DirectDecomposition:
    """The metric as the dla map's parts and the rest of the direct logit attribution; blocks from 1."""

    token_parts: np.ndarray  # (blocks, tokens) float64: each block's head terms per source token, summed over heads
    embedding: float  # the term of the rows entering block 1 (patch embedding, position embedding, prefix tokens)
    attention_biases: np.ndarray  # (blocks,) the term of each block's attention output bias
    mlps: np.ndarray  # (blocks,) the term of each block's MLP output
    constant: float  # the readout's constant (LayerNorm shift and head bias)
    pool_mlp: float  # the attention pooling MLP's term (vitcli.experiments.readout); 0 for CLS or mean pooling
    model_metric: float  # the model's own logit (minus the contrast's), or the embedding target's score

    @property
    def reconstruction(self) -> float:
        rest = self.embedding + float(self.attention_biases.sum()) + float(self.mlps.sum()) + self.constant
        rest += self.pool_mlp
        return float(self.token_parts.sum()) + rest

    @property
    def difference(self) -> float:
        return abs(self.reconstruction - self.model_metric)


def direct_decomposition(
    model: VitModel, prepared: PreparedImage, target: int | BoundTarget, contrast: int | None = None
) -> DirectDecomposition:
    """One forward (no backward) of `prepared`; refused (VitcliError) when the parts do not rebuild the metric.
    `target`: a class index (with `contrast`: target - contrast), or an embedding target."""
    net, depth = model.net, model.depth
    blocks = range(1, depth + 1)
    sites = ["blocks.1.hook_resid_pre", f"blocks.{depth}.hook_resid_post"]
    sites += [f"blocks.{b}.hook_mlp_out" for b in blocks]
    sites += [site for b in blocks for site in token_sites(model, b)]
    embedding = target if isinstance(target, BoundTarget) else None
    with torch.inference_mode(), caching(net, sites) as cache, output_of(model, embedding):
        output = net(prepared.input[None].to(model.device))[0].double().cpu()
    cache = {site: activation[0].double().cpu() for site, activation in cache.items()}
    final_rows = cache[f"blocks.{depth}.hook_resid_post"]
    if embedding is not None:  # `output` is the pooled embedding
        readout = linear_readout(net, final_rows, None, None, embedding.readout(output))
        model_metric = float(embedding.score(output[None])[0])
    else:
        readout = linear_readout(net, final_rows, target, contrast)
        model_metric = float(output[target] - (output[contrast] if contrast is not None else 0.0))
    parts, biases = zip(*(token_parts(model, cache, readout, b) for b in blocks), strict=True)
    result = DirectDecomposition(
        torch.stack(parts).sum(dim=1).numpy(),
        readout.term(cache["blocks.1.hook_resid_pre"]),
        np.array(biases),
        np.array([readout.term(cache[f"blocks.{b}.hook_mlp_out"]) for b in blocks]),
        readout.constant,
        readout.pool_mlp,
        model_metric,
    )
    if not result.difference <= RECONSTRUCTION_TOLERANCE:
        raise VitcliError(
            f"self-check failed: the dla map's parts plus the other direct terms give {result.reconstruction:.6g} "
            f"but the model's {'score' if embedding is not None else 'logit'} is {model_metric:.6g} (difference "
            f"{result.difference:.3g}, tolerance {RECONSTRUCTION_TOLERANCE:g})"
        )
    return result


def dla_map(model: VitModel, decomposition: DirectDecomposition) -> np.ndarray:
    """The patches' parts summed over blocks, (grid rows, grid cols): entry [r, c] belongs to patch r * cols + c + 1."""
    grid = model.map_grid
    return decomposition.token_parts.sum(axis=0)[grid.num_prefix :].reshape(grid.rows, grid.cols)


def dla_definition(metric: str) -> str:
    return (
        f"direct contribution of each patch to the {metric} through every block's attention heads: sum over blocks, "
        "heads and query rows r of A_h[r, j] (v_j W_O,h^T) . readout direction of row r (final LayerNorm's scale "
        "frozen); with the prefix tokens' parts, the embedding, attention-bias and MLP terms and the readout constant "
        f"it sums to the {metric}"
    )
