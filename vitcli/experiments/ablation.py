"""Ablation: remove one head (or one whole attention or MLP sublayer) at a time and measure the target's change.

A head is ablated at its slice of the input of attn.proj (blocks.B.attn.hook_z), a sublayer at what it adds to the
residual (blocks.B.hook_attn_out / hook_mlp_out, layer scale included). The replacement is 0 (`zero`), the mean of
that activation over the reference images, token by token (`mean`), or its value on one reference image
(`resample`). All ablations of one image run as batched forwards, one row per ablation: the rows entering the
earliest ablated block of a batch are the clean image's (kept from one clean forward), so a batch only runs the
blocks from there on; on a CPU two batches run at once (VitModel.stream), each hook reading its own thread's batch.
An embedding target (vitcli.targets) is measured by its score of the pooled embedding in place of the target logit
(no probability, no top-1: the forward ends at the embedding).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vitcli.capture import (
    Part,
    caching,
    head_site,
    hooks,
    logits_from,
    replaced,
    resid_pre_site,
    sublayer_site,
)
from vitcli.experiments.results import ClassProbability, EmbeddingScore, class_probability
from vitcli.images import ImageSource
from vitcli.model import PreparedImage, VitModel
from vitcli.target_class import target_or_top1
from vitcli.targets import BoundTarget, output_of

HEAD, ATTENTION, MLP = "head", "attn", "mlp"
ZERO, MEAN, RESAMPLE = "zero", "mean", "resample"
MODES = (ZERO, MEAN, RESAMPLE)


@dataclass(frozen=True, order=True)
class Ablation:
    block: int  # one-based
    site: str  # HEAD, ATTENTION or MLP
    head: int | None = None  # one-based, for HEAD

    @property
    def label(self) -> str:
        """How the options spell it: 4.2 (block 4, head 2), 4.attn, 4.mlp."""
        return f"{self.block}.{self.head if self.site == HEAD else self.site}"

    @property
    def hook_site(self) -> str:
        return head_site(self.block) if self.site == HEAD else sublayer_site(self.block, self.site)

    def part(self, row: int) -> Part:
        """What this ablation replaces of batch row `row` of its hook site's activation (every token)."""
        return Part(row, head=self.head if self.site == HEAD else None)


@dataclass(frozen=True)
class AblationOutcome:
    ablation: Ablation
    target_logit: float  # an embedding target's score instead
    logit_change: float  # ablated - clean
    target_probability: float | None  # None for an embedding target
    probability_change: float | None  # ablated - clean
    top1: ClassProbability | None  # of the ablated forward; None for an embedding target
    top1_changed: bool


@dataclass
class AblationResult:
    source: ImageSource
    weights_label: str
    mode: str
    reference: str  # what the replacements came from, in words
    depth: int
    num_heads: int  # the most heads of any block: the heads map's columns (Swin's blocks have 3 to 24)
    target: ClassProbability | EmbeddingScore  # clean probability, or the embedding target's clean score
    clean_logit: float  # the embedding target's clean score for one
    clean_top1: ClassProbability | None
    outcomes: list[AblationOutcome]


class Replacements:
    """What an ablated activation becomes, per site: zeros, or (tokens, ...) values from the reference images."""

    def __init__(self, mode: str, values: dict[str, Tensor] | None = None, description: str = "0"):
        self.mode = mode
        self.values = values or {}
        self.description = description

    def value(self, ablation: Ablation, running: Tensor) -> Tensor:
        """The replacement of the ablated part's running value (tokens, ...) of one row."""
        if self.mode == ZERO:
            return torch.zeros_like(running)
        stored = self.values[ablation.hook_site].to(running.device, running.dtype)
        return stored[ablation.part(0).within_row]


def resample_source(references: Sequence[Path], image: Path) -> Path:
    """The reference image a resampled ablation takes its values from: the first that is not `image` itself (the
    image itself only when it is the sole reference)."""
    others = [path for path in references if path.resolve() != image.resolve()]
    return (others or list(references))[0]


def reference_replacements(
    model: VitModel, mode: str, ablations: Sequence[Ablation], paths: Sequence[Path]
) -> Replacements:
    """Zeros, or the mean over `paths` (for resample: one path) of every site the ablations touch, token by token."""
    if mode == ZERO:
        return Replacements(ZERO)
    sites = sorted({ablation.hook_site for ablation in ablations})
    totals: dict[str, Tensor] = {}
    for start in range(0, len(paths), model.batch_size):
        inputs = torch.stack([model.prepare(path).input for path in paths[start : start + model.batch_size]])
        with torch.inference_mode(), caching(model.net, sites) as cache:
            model.net(inputs.to(model.device))
        for site in sites:
            total = cache[site].double().sum(dim=0).cpu()
            totals[site] = total if site not in totals else totals[site] + total
    described = f"{MEAN} over {len(paths)} reference images" if mode == MEAN else f"{RESAMPLE} from {paths[0]}"
    return Replacements(mode, {site: total / len(paths) for site, total in totals.items()}, described)


def ablation_logits(
    model: VitModel,
    prepared: PreparedImage,
    ablations: Sequence[Ablation],
    replacements: Replacements,
    on_progress: Callable[[int], None] = lambda _count: None,
    embedding: BoundTarget | None = None,
) -> tuple[Tensor, Tensor]:
    """(clean logits (classes,), ablated logits (ablations, classes) in the order given), CPU float32; pooled
    embeddings instead of logits for an embedding target."""
    net = model.net
    resid_sites = [resid_pre_site(block) for block in range(1, model.depth + 1)]
    output = output_of(model, embedding)
    with torch.inference_mode(), caching(net, resid_sites) as cache, _threads(1 if model.streams > 1 else None), output:
        clean = net(prepared.input[None].to(model.device))[0].float().cpu()
    order = sorted(range(len(ablations)), key=lambda index: ablations[index])
    chunks = [order[start : start + model.batch_size] for start in range(0, len(order), model.batch_size)]
    ablated = torch.empty(len(ablations), clean.shape[0])
    current = threading.local()  # the chunk a thread is running: model.stream runs two chunks at once on a CPU

    def replacer(site: str) -> Callable[[Tensor], Tensor | None]:
        def replace(activation: Tensor) -> Tensor | None:
            rows = current.by_site.get(site)
            if not rows:
                return None
            return replaced(
                activation,
                [(ablation.part(row), partial(replacements.value, ablation)) for row, ablation in rows],
            )

        return replace

    def forward(chunk_index: Tensor) -> Tensor:
        """The logits of one chunk, run from the clean rows entering its earliest ablated block."""
        chunk = [ablations[index] for index in chunks[int(chunk_index)]]
        current.by_site = {}
        for row, ablation in enumerate(chunk):
            current.by_site.setdefault(ablation.hook_site, []).append((row, ablation))
        first = min(ablation.block for ablation in chunk)
        return logits_from(net, first, cache[resid_pre_site(first)].expand(len(chunk), -1, -1))

    sites = {ablation.hook_site for ablation in ablations}
    with hooks(net, {site: replacer(site) for site in sites}), output_of(model, embedding):
        # stream() hands each "batch" to forward(); here a batch is the index of a chunk.
        indexes = (torch.tensor(index) for index in range(len(chunks)))
        for chunk, logits in zip(chunks, model.stream(forward, indexes), strict=True):
            ablated[chunk] = logits
            on_progress(len(chunk))
    return clean, ablated


@contextmanager
def _threads(count: int | None) -> Iterator[None]:
    """torch's thread count set to `count` inside the `with` (None: unchanged).

    The clean forward of one image runs on one thread when the batches will stream: one image gains little from a
    second thread, and on a shared CPU waits for it (measured under a load average of 12 on 2 cores: 1.25 s on two
    threads, 0.06 s on one)."""
    threads = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def ablate(
    model: VitModel,
    prepared: PreparedImage,
    ablations: Sequence[Ablation],
    replacements: Replacements,
    target: int | None,
    on_progress: Callable[[int], None] = lambda _count: None,
    embedding: BoundTarget | None = None,
) -> AblationResult:
    """Every ablation of one image, in batches of the model's batch size, against its clean forward; `embedding`:
    an embedding target followed instead of a class."""
    clean, ablated = ablation_logits(model, prepared, ablations, replacements, on_progress, embedding)
    if embedding is not None:
        return _embedding_result(model, prepared, ablations, replacements, embedding, clean, ablated)
    clean_probabilities = model.probabilities(clean)
    probabilities = model.probabilities(ablated)
    target = target_or_top1(target, clean)
    clean_top1 = int(clean.argmax())
    outcomes = []
    for row, ablation in enumerate(ablations):
        top = int(ablated[row].argmax())
        outcomes.append(
            AblationOutcome(
                ablation,
                float(ablated[row, target]),
                float(ablated[row, target] - clean[target]),
                float(probabilities[row, target]),
                float(probabilities[row, target] - clean_probabilities[target]),
                class_probability(model.labels, top, probabilities[row]),
                top != clean_top1,
            )
        )
    return AblationResult(
        prepared.source,
        model.spec.label,
        replacements.mode,
        replacements.description,
        model.depth,
        max(place.heads for place in model.family.places()),  # the maps' columns: Swin's last stage has the most
        class_probability(model.labels, target, clean_probabilities),
        float(clean[target]),
        class_probability(model.labels, clean_top1, clean_probabilities),
        outcomes,
    )


def _embedding_result(
    model: VitModel,
    prepared: PreparedImage,
    ablations: Sequence[Ablation],
    replacements: Replacements,
    embedding: BoundTarget,
    clean: Tensor,
    ablated: Tensor,
) -> AblationResult:
    clean_score = float(embedding.score(clean[None])[0])
    scores = embedding.score(ablated).tolist()
    outcomes = [
        AblationOutcome(ablation, score, score - clean_score, None, None, None, False)
        for ablation, score in zip(ablations, scores, strict=True)
    ]
    return AblationResult(
        prepared.source,
        model.spec.label,
        replacements.mode,
        replacements.description,
        model.depth,
        max(place.heads for place in model.family.places()),  # the maps' columns: Swin's last stage has the most
        EmbeddingScore(embedding.target, clean_score),
        clean_score,
        None,
        outcomes,
    )


@dataclass(frozen=True)
class AblationSpread:
    """One ablation over several images (each with its own target)."""

    ablation: Ablation
    images: int
    mean_logit_change: float  # of an embedding target's score, for one
    mean_probability_change: float | None  # None for an embedding target
    top1_changed_fraction: float


@dataclass
class AblationSpreads:
    weights_label: str
    mode: str
    reference: str
    depth: int
    num_heads: int
    spreads: list[AblationSpread]
    measure: str = "logit"  # what changed: the target logit, or an embedding target's "score"


def ablation_spread(documents: Sequence[dict[str, Any]]) -> AblationSpreads:
    """Per ablation, the mean change of each image's target and the fraction of images whose top-1 changed, from the
    images' stored JSON bodies (so resumed and sharded runs give a fresh run's numbers)."""
    first = documents[0]
    spreads = []
    for index, row in enumerate(first["ablations"]):
        outcomes = [document["ablations"][index] for document in documents]
        spreads.append(
            AblationSpread(
                Ablation(row["block"], row["site"], row["head"]),
                len(outcomes),
                sum(_change(outcome) for outcome in outcomes) / len(outcomes),
                None
                if "probability_change" not in row
                else sum(outcome["probability_change"] for outcome in outcomes) / len(outcomes),
                sum(bool(outcome.get("top1_changed")) for outcome in outcomes) / len(outcomes),
            )
        )
    references = sorted({document["reference"] for document in documents})
    reference = references[0] if len(references) == 1 else f"{first['mode']}: a reference image per image"
    shape = first["model"]
    measure = "score" if "score_change" in first["ablations"][0] else "logit"
    return AblationSpreads(
        first["weights"], first["mode"], reference, shape["blocks"], shape["heads"], spreads, measure
    )


def _change(stored: dict[str, Any]) -> float:
    """A stored row's change: of the target logit, or of an embedding target's score."""
    return stored["logit_change"] if "logit_change" in stored else stored["score_change"]
