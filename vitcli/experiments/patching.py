"""Activation patching between two images (`vitcli patch CLEAN CORRUPT`), and its first-order estimate.

M = logit(target) - logit(contrast), or an embedding target's score of the pooled embedding (vitcli.targets; every
forward then ends at the embedding). Run CORRUPT and at one site put back CLEAN's activation: the score
(M_patched - M_corrupt) / (M_clean - M_corrupt) is 1 when that site alone restores the clean metric and 0 when it
changes nothing. Patched runs are batched (one row per site) and start at the earliest block a batch patches, from
CORRUPT's rows entering it (the blocks before are CORRUPT's own run). Attribution patching estimates every site at
once from one forward of each image and one backward of CORRUPT's M: (a_clean - a_corrupt) . dM/da.

The sites are vitcli.capture' named hook sites (blocks count from one):
- `residual`: blocks.B.hook_resid_pre, the row of token t entering the block (CLS is token 0, Pn is token n), or
  every row;
- `attention`, `mlp`: blocks.B.hook_attn_out / hook_mlp_out, what the sublayer adds to the residual, every token
  (layer scale included: patching before or after the elementwise ls1/ls2 gives the same run, and the same estimate);
- `heads`: blocks.B.attn.hook_z, head h's slice of the input of attn.proj (its A_h V_h, every token).
A patch moves the running value to the stored one by lerp(running, stored, alpha), alpha = 1 meaning the stored value
exactly (torch.lerp returns `end` at weight 1).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from vitcli.capture import (
    Part,
    caching,
    head_site,
    hooks,
    logits_from,
    pre_norm_refusal,
    replaced,
    resid_pre_site,
    sublayer_site,
)
from vitcli.errors import UsageError, VitcliError
from vitcli.experiments.patch_result import (
    DENOMINATOR_TOLERANCE,
    ImageSide,
    KindScores,
    PatchResult,
    correlations,
)
from vitcli.experiments.results import top_classes
from vitcli.experiments.trace import full_float32
from vitcli.jobs import Steps
from vitcli.model import PreparedImage, VitModel
from vitcli.targets import BoundTarget, output_of

KINDS = ("residual", "attention", "mlp", "heads")
METHODS = ("activation", "attribution")
# |M_clean - M_corrupt| at or below this is "equal": the score's denominator would be float32 rounding noise.
TOP_SHOWN = 3


@dataclass(frozen=True)
class Site:
    kind: str  # one of KINDS
    block: int  # one-based
    index: int | None = None  # residual: the token (None: every token); heads: the head, one-based

    @property
    def hook_site(self) -> str:
        return hook_site(self.kind, self.block)

    def part(self, row: int) -> Part:
        """What this site patches of batch row `row` of its hook site's activation."""
        if self.kind == "residual":
            return Part(row, token=self.index)
        return Part(row, head=self.index) if self.kind == "heads" else Part(row)


def hook_site(kind: str, block: int) -> str:
    """The components site a kind of patch site reads and writes in one block."""
    if kind == "residual":
        return resid_pre_site(block)
    return head_site(block) if kind == "heads" else sublayer_site(block, {"attention": "attn", "mlp": "mlp"}[kind])


@contextmanager
def patching(net: nn.Module, sites: Sequence[Site], stored: dict[str, Tensor], alpha: float = 1.0) -> Iterator[None]:
    """Inside the block, row k of a batch gets site k's value moved to `stored`'s: lerp(running, stored, alpha).

    `stored` is kind -> (blocks, tokens, ...) as in PairRun, e.g. the clean run's."""
    edits: dict[str, list[tuple[Part, Callable[[Tensor], Tensor]]]] = defaultdict(list)
    for row, site in enumerate(sites):
        part = site.part(row)
        source = stored[site.kind][site.block - 1][part.within_row]
        edits[site.hook_site].append((part, lambda running, source=source: torch.lerp(running, source, alpha)))
    with hooks(net, {name: lambda value, edits=edits[name]: replaced(value, edits) for name in edits}):
        yield


@dataclass
class PairRun:
    """Both images' activations at every site (kind -> (blocks, tokens, width), heads: (blocks, tokens, heads,
    head_dim)), their logits, the classes of M and, for attribution, the gradient of CORRUPT's M at every site."""

    clean: dict[str, Tensor]
    corrupt: dict[str, Tensor]
    clean_logits: Tensor  # (classes,) float64 on the CPU; the pooled embedding (D,) for an embedding target
    corrupt_logits: Tensor
    target: int | None  # None for an embedding target
    contrast: int | None
    target_rule: str  # how the class was chosen: "given", "CLEAN's top-1", ...
    contrast_rule: str
    gradients: dict[str, Tensor] | None
    embedding: BoundTarget | None = None

    def metric(self, logits: Tensor) -> Tensor:
        """M of each row of (rows, classes) logits (pooled embeddings for an embedding target), float64."""
        if self.embedding is not None:
            rows = logits.double().reshape(-1, logits.shape[-1])
            return self.embedding.score(rows).reshape(logits.shape[:-1])
        return logits[..., self.target].double() - logits[..., self.contrast].double()

    @property
    def m_clean(self) -> float:
        return float(self.metric(self.clean_logits))

    @property
    def m_corrupt(self) -> float:
        return float(self.metric(self.corrupt_logits))


def sites_of(kind: str, depth: int, tokens: int, heads: int) -> list[Site]:
    """Every site of one kind, block by block, in the order the kind's score array is shaped."""
    if kind == "residual":
        return [Site(kind, block, token) for block in range(1, depth + 1) for token in range(tokens)]
    if kind == "heads":
        return [Site(kind, block, head) for block in range(1, depth + 1) for head in range(1, heads + 1)]
    return [Site(kind, block) for block in range(1, depth + 1)]


@dataclass
class CorruptForward:
    """CORRUPT's forward, kept for every CLEAN patched into it (a `vitcli run` of many images into one CORRUPT): its
    activations by kind, its logits and, when gradients are wanted, its graph, from which the gradient of each
    (target, contrast) pair's M is taken once (the graph is kept for the next pair)."""

    activations: dict[str, Tensor]
    logits: Tensor  # (1, classes), in the graph when gradients are wanted
    captured: dict[str, Tensor] | None  # site -> activation in the graph (None: no gradients)
    _gradients: dict[tuple[Any, Any], dict[str, Tensor]] = field(default_factory=dict)
    embedding: BoundTarget | None = None  # the forward ended at the pooled embedding, for this target

    def gradients(self, target: int | None, contrast: int | None, depth: int) -> dict[str, Tensor]:
        """The gradient of CORRUPT's M = logit(target) - logit(contrast) (the embedding target's score) at every
        site, by kind."""
        assert self.captured is not None, "CORRUPT's forward was run without gradients"
        if (target, contrast) not in self._gradients:
            with full_float32(), torch.enable_grad():
                if self.embedding is not None:
                    metric = self.embedding.score(self.logits)[0]
                else:
                    metric = self.logits[0, target] - self.logits[0, contrast]
                found = torch.autograd.grad(metric, list(self.captured.values()), retain_graph=True)
            self._gradients[target, contrast] = _by_kind(dict(zip(self.captured, found, strict=True)), depth)
        return self._gradients[target, contrast]


def corrupt_forward(
    model: VitModel, corrupt: Tensor, gradients: bool = False, embedding: BoundTarget | None = None
) -> CorruptForward:
    """One forward of CORRUPT's (3, H, W) normalized input capturing every site (with its graph for gradients);
    ending at the pooled embedding for an embedding target."""
    refusal = pre_norm_refusal(model.net, model.name)
    if refusal is not None:
        raise UsageError(refusal)
    with full_float32(), torch.enable_grad() if gradients else torch.inference_mode(), output_of(model, embedding):
        captured, logits = _forward(model, corrupt, gradients)
    return CorruptForward(_by_kind(captured, model.depth), logits, captured if gradients else None, embedding=embedding)


def run_pair(
    model: VitModel,
    clean: Tensor,
    corrupt: Tensor | CorruptForward,
    target: int | None = None,
    contrast: int | None = None,
    gradients: bool = False,
    embedding: BoundTarget | None = None,
) -> PairRun:
    """One forward of each (3, H, W) normalized input capturing every site (CORRUPT's may be given already run);
    with gradients, one backward of CORRUPT's M. target defaults to CLEAN's top-1; contrast to CORRUPT's top-1, or
    its second when that is the target. An embedding target's score is M instead (no classes)."""
    if not isinstance(corrupt, CorruptForward):
        corrupt = corrupt_forward(model, corrupt, gradients, embedding)
    with full_float32(), torch.inference_mode(), output_of(model, embedding):
        clean_captured, clean_logits = _forward(model, clean)
    corrupt_logits = corrupt.logits.detach()
    if embedding is not None:
        target = contrast = None
        target_rule = contrast_rule = f"{embedding.target.option}: M is its score, no contrast"
    else:
        target, contrast, target_rule, contrast_rule = _classes(
            clean_logits, corrupt_logits, target, contrast, model.labels
        )
    grads = corrupt.gradients(target, contrast, model.depth) if gradients else None
    return PairRun(
        _by_kind(clean_captured, model.depth),
        corrupt.activations,
        clean_logits[0].detach().double().cpu(),
        corrupt_logits[0].double().cpu(),
        target, contrast, target_rule, contrast_rule, grads, embedding,
    )  # fmt: skip


def _forward(model: VitModel, image: Tensor, gradients: bool = False) -> tuple[dict[str, Tensor], Tensor]:
    """The model's own layers on one image, every site cached; with gradients, the rows entering block 1 are a
    leaf that requires its gradient, so the graph exists even for a model with frozen parameters."""
    net = model.net
    x = image.unsqueeze(0).to(model.device, dtype=net.patch_embed.proj.weight.dtype)
    rows = model.embed(x)
    if gradients:
        rows = rows.detach().requires_grad_()
    sites = [hook_site(kind, block) for kind in KINDS for block in range(1, model.depth + 1)]
    with caching(net, sites) as cache:
        logits = logits_from(net, 1, rows)
    return cache, logits


def _by_kind(by_site: dict[str, Tensor], depth: int) -> dict[str, Tensor]:
    """kind -> (blocks, tokens, ...) of the first image of activations cached by site name (detached)."""
    return {
        kind: torch.stack([by_site[hook_site(kind, block)][0].detach() for block in range(1, depth + 1)])
        for kind in KINDS
    }


def _classes(
    clean: Tensor, corrupt: Tensor, target: int | None, contrast: int | None, labels: Sequence[str]
) -> tuple[int, int, str, str]:
    target_rule = "given"
    if target is None:
        target, target_rule = int(clean[0].argmax()), "CLEAN's top-1"
    if contrast is not None:
        if contrast == target:
            raise UsageError(
                f"--contrast {contrast} ({labels[contrast]}) is CLEAN's top-1, the default target: M = logit(target) "
                "- logit(contrast) would be 0; give --target"
            )
        return target, contrast, target_rule, "given"
    first, second = corrupt[0].detach().topk(2).indices.tolist()
    if first != target:
        return target, first, target_rule, "CORRUPT's top-1"
    return target, second, target_rule, "CORRUPT's second (its top-1 is the target)"


def patched_metric(
    model: VitModel, pair: PairRun, sites: Sequence[Site], alpha: float = 1.0, steps: Steps | None = None
) -> Tensor:
    """M of CORRUPT's run with each site (one per row) moved to CLEAN's value, lerp(corrupt, clean, alpha):
    (sites,) float64 on the CPU, in batches of the model's batch size."""
    net, steps = model.net, steps or Steps()
    values = []
    with full_float32(), torch.inference_mode(), output_of(model, pair.embedding):
        for first in range(0, len(sites), model.batch_size):
            batch = sites[first : first + model.batch_size]
            start = min(site.block for site in batch)
            rows = pair.corrupt["residual"][start - 1].expand(len(batch), -1, -1)
            with patching(net, batch, pair.clean, alpha):
                values.append(pair.metric(logits_from(net, start, rows)).cpu())
            steps.advance(len(batch))
    return torch.cat(values) if values else torch.zeros(0, dtype=torch.float64)


def attribution_deltas(pair: PairRun, kind: str) -> Tensor:
    """(a_clean - a_corrupt) . dM/da for every site of a kind, shaped like its scores, float64."""
    assert pair.gradients is not None
    products = ((pair.clean[kind] - pair.corrupt[kind]) * pair.gradients[kind]).double().cpu()  # (blocks, tokens, ...)
    if kind == "residual":
        return products.sum(-1)
    if kind == "heads":
        return products.sum((1, 3))  # (blocks, tokens, heads, head_dim)
    return products.sum((1, 2))


def patch_images(
    model: VitModel,
    clean: PreparedImage,
    corrupt: PreparedImage,
    kinds: Sequence[str] = KINDS,
    methods: Sequence[str] = ("activation",),
    target: int | None = None,
    contrast: int | None = None,
    steps: Steps | None = None,
    corrupt_run: CorruptForward | None = None,
    embedding: BoundTarget | None = None,
) -> PatchResult:
    """Patch every site of each kind from CLEAN into CORRUPT by the chosen methods (see the module's docstring).
    corrupt_run: CORRUPT's forward when already run (with gradients if attribution is asked), shared by many CLEANs.
    embedding: an embedding target whose score is M (target and contrast are then None)."""
    if target is not None and target == contrast:
        raise UsageError(f"--contrast {contrast} is the --target class: M = logit(target) - logit(contrast) would be 0")
    steps = steps or Steps()
    pair = run_pair(
        model,
        clean.input,
        corrupt_run or corrupt.input,
        target,
        contrast,
        gradients="attribution" in methods,
        embedding=embedding,
    )
    denominator = pair.m_clean - pair.m_corrupt
    if abs(denominator) <= DENOMINATOR_TOLERANCE:
        raise VitcliError(
            f"M_clean = M_corrupt ({pair.m_clean:.6g} vs {pair.m_corrupt:.6g}, difference {denominator:.2g}, at most "
            f"{DENOMINATOR_TOLERANCE:g}) for {_followed(pair)}: CORRUPT already gives "
            "CLEAN's metric, so (M_patched - M_corrupt) / (M_clean - M_corrupt) is undefined; give two images "
            "(or classes) that differ"
        )
    tokens, heads = pair.clean["residual"].shape[1], model.num_heads
    scores, forwards = [], 0
    for kind in kinds:
        sites = sites_of(kind, model.depth, tokens, heads)
        shape = (model.depth, tokens) if kind == "residual" else (model.depth, heads) if kind == "heads" else (-1,)
        activation = attribution = None
        if "activation" in methods:
            steps.start(len(sites), f"patching {kind}")
            patched = patched_metric(model, pair, sites, steps=steps)
            activation = ((patched - pair.m_corrupt) / denominator).reshape(shape).numpy()
            forwards += len(sites)
        if "attribution" in methods:
            attribution = (attribution_deltas(pair, kind) / denominator).reshape(shape).numpy()
        scores.append(KindScores(kind, activation, attribution, *correlations([activation], [attribution])))
    pearson, spearman = correlations([s.activation for s in scores], [s.attribution for s in scores])
    labels = (None, None) if embedding is not None else (model.labels[pair.target], model.labels[pair.contrast])
    result = PatchResult(
        model.spec.label, model.name, model.grid,
        _side(model, clean, pair.clean_logits, pair.m_clean, embedding is None),
        _side(model, corrupt, pair.corrupt_logits, pair.m_corrupt, embedding is None),
        pair.target, labels[0] or embedding.target.short, pair.target_rule,
        pair.contrast, labels[1] or "", pair.contrast_rule,
        list(methods), scores, forwards, pearson, spearman,
    )  # fmt: skip
    result.embedding = None if embedding is None else embedding.target
    return result


def _followed(pair: PairRun) -> str:
    if pair.embedding is not None:
        return pair.embedding.target.short
    return f"target {pair.target} and contrast {pair.contrast}"


def _side(model: VitModel, image: PreparedImage, logits: Tensor, m: float, classes: bool = True) -> ImageSide:
    """One image of the pair: its top classes (none when the forward ended at the embedding) and its M."""
    top = top_classes(logits, model.probabilities(logits), model.labels, TOP_SHOWN) if classes else []
    return ImageSide(image.source, image.crop_uint8(), top, m)
