"""`vitcli heads`: the heads of the last blocks of an image-text model, each described by a few texts (TextSpan).

Gandelsman et al. (ICLR 2024) read a CLIP image embedding as a sum of direct contributions: with the final
LayerNorm's scale frozen at each image's value (vitcli.experiments.readout.embedding_readout), the embedding is a
linear readout of the final rows, which are the rows entering the first decomposed block plus, for every block from
it, each head's output z_h W_O,h^T, the attention bias and the MLP output (each times the block's layer scale). So

    embedding = readout(rows entering block F) + sum over blocks >= F of (sum over heads of readout(head)
                + readout(attention bias) + readout(MLP)) + constant + pooling MLP,

where the pooling MLP term is an attention pooling's (SigLIP's 'map' head) MLP output, frozen like the LayerNorm's
scale (zero for CLS and mean pooling); checked per image against the model's own embedding. One head's readouts
over the images, (images, D), are what TextSpan (vitcli.experiments.textspan) describes with the bank's text
embeddings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from vitcli.capture import caching
from vitcli.errors import VitcliError
from vitcli.experiments.attribution import attention_output
from vitcli.experiments.readout import embedding_readout
from vitcli.experiments.textspan import text_span
from vitcli.images import ImageSource
from vitcli.model import PreparedImage, VitModel
from vitcli.text_bank import TextBank

DEFAULT_BLOCKS = 4  # the paper's: the last four blocks carry nearly all of the direct effect in CLIP ViT-L and H
DEFAULT_K = 5  # texts per head: the paper's tables describe heads with five
EMBEDDING_TOLERANCE = 1e-4  # largest difference of the summed parts from the model's own embedding, per coordinate


@dataclass
class EmbeddingParts:
    """One image's embedding as a sum of direct contributions, each (D,) float64 (or one per block, head)."""

    first_block: int  # one-based: the rows entering it are the `embedding` term
    heads: Tensor  # (blocks, heads, D): each head of each block from first_block
    biases: Tensor  # (blocks, D): each block's attention bias
    mlps: Tensor  # (blocks, D)
    embedding: Tensor  # (D,)
    constant: Tensor  # (D,): the biases of the readout (LayerNorm shift, the attention pooling's biases)
    pool_mlp: Tensor  # (D,): an attention pooling's MLP output (zero for CLS and mean pooling)
    pooled: Tensor  # (D,): the model's own image embedding

    def rebuilt(self) -> Tensor:
        components = self.heads.sum(dim=(0, 1)) + self.biases.sum(dim=0) + self.mlps.sum(dim=0) + self.embedding
        return components + self.constant + self.pool_mlp


@dataclass(frozen=True)
class HeadTexts:
    block: int  # one-based
    head: int  # one-based
    texts: list[int]  # indices into the bank, in the order TextSpan chose them
    shares: list[float]  # each one's share of the head's variance over the images
    total_variance: float  # of the head's contribution over the images (trace of its covariance)
    rank: int  # dimensions of the head's span the texts were projected onto

    @property
    def explained(self) -> float:
        return float(sum(self.shares))


@dataclass
class HeadsResult:
    weights: str
    model_name: str
    bank_path: Path
    bank_sha256: str
    texts: list[str]  # the bank, in its order
    k: int
    blocks: list[int]  # one-based, the last --blocks of the model
    heads_per_block: int
    images: list[ImageSource]
    skipped: list[str]  # the one-line refusals of images that could not be read
    heads: list[HeadTexts]  # block by block, head by head
    largest_difference: float  # over images and coordinates: |sum of the parts - the model's embedding|
    text_embeddings_cached: bool  # whether the bank's embeddings came from an earlier run's cache


def encode_bank(model: VitModel, texts: list[str]) -> Tensor:
    """The texts' unit embeddings (texts, D) float32 by the model's text tower; a text longer than its tokenizer's
    context is refused (UsageError, naming the limit)."""
    if model.text is None:
        raise VitcliError(f"{model.name} has no text tower to embed the texts with")
    model.text.check(texts, "--texts")
    return model.text.encode(texts)


def embedding_parts(model: VitModel, inputs: Tensor, first_block: int) -> list[EmbeddingParts]:
    """For a batch of normalized inputs (B, 3, H, W): each image's embedding as direct contributions of the blocks
    from `first_block` (one forward of the model's own, every component captured)."""
    depth, places = model.depth, model.family.places()
    blocks = range(first_block, depth + 1)
    sites = [f"blocks.{first_block}.hook_resid_pre", f"blocks.{depth}.hook_resid_post"]
    sites += [f"blocks.{b}.{name}" for b in blocks for name in ("attn.hook_z", "hook_mlp_out")]
    with torch.inference_mode(), caching(model.net, sites) as cache:
        pooled = model.family.pooled(inputs.to(model.device)).double().cpu()
    cache = {site: activation.double().cpu() for site, activation in cache.items()}
    writers = {b: attention_output(model, b) for b in blocks}
    found = []
    for index in range(len(inputs)):
        mine = {site: activation[index] for site, activation in cache.items()}
        readout = embedding_readout(model.net, mine[f"blocks.{depth}.hook_resid_post"])
        heads, biases, mlps = [], [], []
        for b in blocks:
            weight, bias, scale = writers[b]
            z = mine[f"blocks.{b}.attn.hook_z"]  # (tokens, heads, head_dim)
            per_head = weight.unflatten(-1, (places[b - 1].heads, -1))  # (width, heads, head_dim)
            outputs = torch.einsum("thd,whd->htw", z, per_head) * scale  # each head's rows as the residual adds them
            heads.append(torch.stack([readout.part(output) for output in outputs]))
            bias_rows = torch.zeros_like(outputs[0]) if bias is None else (bias * scale).expand_as(outputs[0])
            biases.append(readout.part(bias_rows))
            mlps.append(readout.part(mine[f"blocks.{b}.hook_mlp_out"]))
        embedding = readout.part(mine[f"blocks.{first_block}.hook_resid_pre"])
        found.append(
            EmbeddingParts(
                first_block, torch.stack(heads), torch.stack(biases), torch.stack(mlps), embedding,
                readout.constant, readout.pool_mlp, pooled[index],
            )
        )  # fmt: skip
    return found


def describe_heads(
    model: VitModel,
    images: Iterable[PreparedImage],
    bank: TextBank,
    text_embeddings: Tensor,
    blocks: int,
    k: int,
    cached: bool,
    progress: Callable[[int], None] | None = None,
) -> HeadsResult:
    """TextSpan of every head of the last `blocks` blocks over `images`; progress(n) after each batch with the images
    done. Refused (VitcliError) when the parts of an image do not add up to its embedding."""
    first = model.depth - blocks + 1
    heads_per_block = model.family.places()[first - 1].heads
    contributions: list[np.ndarray] = []  # per batch: (images, blocks, heads, D) float32
    sources: list[ImageSource] = []
    largest = 0.0
    for batch in _batches(images, model.batch_size):
        for parts in embedding_parts(model, torch.stack([image.input for image in batch]), first):
            largest = max(largest, float((parts.rebuilt() - parts.pooled).abs().max()))
            contributions.append(parts.heads.float().numpy()[None])
        sources.extend(image.source for image in batch)
        if progress is not None:
            progress(len(sources))
    if len(sources) < 2:
        raise VitcliError(f"{len(sources)} image could be read: a head's variance over the images needs at least 2")
    if not largest <= EMBEDDING_TOLERANCE:
        raise VitcliError(
            f"self-check failed: the heads' and the other components' direct contributions add up to the image "
            f"embedding only within {largest:.3g} (tolerance {EMBEDDING_TOLERANCE:g})"
        )
    stacked = np.concatenate(contributions)  # (images, blocks, heads, D)
    texts = text_embeddings.double().numpy()
    found = []
    for index, block in enumerate(range(first, model.depth + 1)):
        for head in range(heads_per_block):
            span = text_span(stacked[:, index, head], texts, k)
            found.append(
                HeadTexts(block, head + 1, span.texts.tolist(), span.shares.tolist(), span.total_variance, span.rank)
            )
    return HeadsResult(
        model.spec.label, model.name, bank.path, bank.sha256, bank.texts, k, list(range(first, model.depth + 1)),
        heads_per_block, sources, [], found, largest, cached,
    )  # fmt: skip


def _batches(images: Iterable[PreparedImage], size: int) -> Iterator[list[PreparedImage]]:
    batch: list[PreparedImage] = []
    for image in images:
        batch.append(image)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
