"""What patch size does to a ViT: tokens, attention scores and compute, counted in closed form and measured.

Every variant is the same architecture (width, depth, heads, MLP) built at another patch size; only the patch
embedding (3 p^2 x D + D parameters) and the position embeddings (one per grid cell) change shape. The saved
checkpoint was trained at one patch size, so the table is an architectural comparison; `adapt` goes further and
resamples the checkpoint itself (FlexiViT pseudo-inverse resampling, as timm does), which is adapted, not retrained.

Compute is counted in multiply-accumulates (MACs) per image. The closed form counts the matrix products:
  patch embedding  n * 3p^2 * D            (n patches; the same 3 * H * W * D for every p that divides the image)
  per block        N * D * 3A  (qkv)  +  heads * N^2 * head_dim  (q k^T)  +  heads * N^2 * head_dim  (weights @ v)
                   + N * A * D  (proj)  +  2 * N * D * M  (MLP)    (N = n + prefix tokens, A = heads * head_dim)
  head             D * classes
FlopCounterMode counts FLOPs = 2 x MACs of matmuls and convolutions only; softmax, layer norm, GELU, the residual
adds, the attention scale and the bias adds are in neither count.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import timm
import torch
import torch.nn.functional as F
from rich.console import Group
from rich.table import Table
from timm.layers import Attention, Mlp
from timm.models.vision_transformer import Block, VisionTransformer
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from vitcli.errors import UsageError, VitcliError
from vitcli.images import ImageSource, load_rgb
from vitcli.loading import require_vit
from vitcli.model import VitModel, software_versions
from vitcli.render import weights_caption

ARCHITECTURE_ONLY = "none (architecture only)"
ADAPTED_NOTE = "adapted, not retrained"
PAD_NOTE = "zero padding on the right and bottom up to a multiple of the patch size, as timm's PatchEmbed(dynamic_img_pad=True)"
CLOSED_FORM_METHOD = (
    "matrix products only: n * 3p^2 * D (patch embedding) + blocks * (N * D * 3A + 2 * heads * N^2 * head_dim "
    "+ N * A * D + 2 * N * D * M) + D * classes; n patches, N = n + prefix tokens, A = heads * head_dim, M = MLP width"
)
FLOP_METHOD = (
    "torch.utils.flop_counter.FlopCounterMode over one forward of a batch of one on the meta device (shapes only), "
    "attention written as explicit matmuls; FLOPs / 2 = MACs; counts matmul, addmm, bmm and convolution, "
    "not softmax, layer norm, GELU or additions"
)
CUDA_MEMORY_METHOD = "torch.cuda.max_memory_allocated during one forward minus the memory allocated before it (CUDA caching allocator)"
TENSOR_MEMORY_METHOD = (
    "largest total size of tensors created during one forward and alive at the same time, sampled after every aten "
    "operator (weights and input excluded; scratch buffers inside a kernel are not seen)"
)


def comparison_note(native_patch: int) -> str:
    return f"architectural comparison: the checkpoint was trained at patch {native_patch}"


# ----- the architecture and its closed-form counts


@dataclass(frozen=True)
class Architecture:
    """The dimensions of a timm ViT that the counts depend on, read from a skeleton built on the meta device."""

    name: str
    native_patch: int
    native_image: int
    in_chans: int
    embed_dim: int
    depth: int
    num_heads: int
    head_dim: int
    mlp_hidden: int
    num_prefix: int
    position_rows: int  # prefix rows that carry a learned position embedding; -1: no absolute position embedding
    head_outputs: int  # classes, summed over classifier heads (two for distilled models), 0 for none

    @property
    def attn_dim(self) -> int:
        return self.num_heads * self.head_dim

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "native_patch_size": self.native_patch,
            "native_image_size": self.native_image,
            "in_chans": self.in_chans,
            "embed_dim": self.embed_dim,
            "depth": self.depth,
            "num_heads": self.num_heads,
            "head_dim": self.head_dim,
            "mlp_hidden": self.mlp_hidden,
            "prefix_tokens": self.num_prefix,
            "classifier_outputs": self.head_outputs,
        }


def read_architecture(name: str) -> Architecture:
    """Validate the model name and read its dimensions without building weights."""
    net = require_vit(name)
    require_countable(net, name)
    attention = net.blocks[0].attn
    patch_height, patch_width = net.patch_embed.patch_size
    image_height, image_width = net.patch_embed.img_size
    if patch_height != patch_width or image_height != image_width:
        raise UsageError(f"{name} has {patch_height}x{patch_width} patches on a {image_height}x{image_width} image; compare-patch-size handles square patches and images")
    return Architecture(
        name=name,
        native_patch=patch_height,
        native_image=image_height,
        in_chans=net.patch_embed.proj.in_channels,
        embed_dim=net.embed_dim,
        depth=len(net.blocks),
        num_heads=attention.num_heads,
        head_dim=attention.head_dim,
        mlp_hidden=net.blocks[0].mlp.fc1.out_features,
        num_prefix=net.num_prefix_tokens,
        position_rows=-1 if net.pos_embed is None else 0 if net.no_embed_class else net.num_prefix_tokens,
        head_outputs=sum(head.out_features for head in classifier_heads(net)),
    )


def require_countable(net: VisionTransformer, name: str) -> None:
    """The closed form assumes timm's standard Block, Attention and Mlp and a class-token or average-pooled head."""
    for index, block in enumerate(net.blocks):
        if type(block) is not Block or type(block.attn) is not Attention or type(block.mlp) is not Mlp:
            raise UsageError(
                f"cannot count {name}: block {index + 1} is a {type(block).__name__} with {type(block.attn).__name__} "
                f"and {type(block.mlp).__name__}; compare-patch-size counts timm's standard Block, Attention and Mlp"
            )
    if net.global_pool not in ("token", "avg"):
        raise UsageError(f"cannot count {name}: its head pools with {net.global_pool!r}; compare-patch-size counts 'token' and 'avg' pooling")


def classifier_heads(net: VisionTransformer) -> list[nn.Linear]:
    return [head for head in (net.head, getattr(net, "head_dist", None)) if isinstance(head, nn.Linear)]


@dataclass(frozen=True)
class MacCount:
    """Multiply-accumulates per image, split by how they grow with the number of tokens."""

    attention: int  # q k^T and weights @ v: grows with N^2
    rest: int  # patch embedding, qkv, proj, MLP, head: grows with N (the patch embedding not at all)

    @property
    def total(self) -> int:
        return self.attention + self.rest


@dataclass(frozen=True)
class Variant:
    """One patch size applied to an image size: its grid and everything counted from it in closed form."""

    architecture: Architecture
    patch_size: int
    image_size: int

    @property
    def padded_size(self) -> int:
        """The image side after padding to a multiple of the patch size (the image size when p divides it)."""
        return math.ceil(self.image_size / self.patch_size) * self.patch_size

    @property
    def padding(self) -> int:
        return self.padded_size - self.image_size

    @property
    def grid_side(self) -> int:
        return self.padded_size // self.patch_size

    @property
    def patch_tokens(self) -> int:
        return self.grid_side**2

    @property
    def tokens(self) -> int:
        return self.patch_tokens + self.architecture.num_prefix

    @property
    def values_per_patch(self) -> int:
        return self.architecture.in_chans * self.patch_size**2

    @property
    def patch_embedding_parameters(self) -> int:
        return self.values_per_patch * self.architecture.embed_dim + self.architecture.embed_dim

    @property
    def position_embedding_parameters(self) -> int:
        rows = self.architecture.position_rows
        return 0 if rows < 0 else (self.patch_tokens + rows) * self.architecture.embed_dim

    @property
    def scores_per_head_block(self) -> int:
        return self.tokens**2

    @property
    def patch_scores_per_head_block(self) -> int:
        return self.patch_tokens**2

    @property
    def scores_whole_model(self) -> int:
        return self.scores_per_head_block * self.architecture.num_heads * self.architecture.depth

    @property
    def patch_scores_whole_model(self) -> int:
        return self.patch_scores_per_head_block * self.architecture.num_heads * self.architecture.depth

    def macs(self) -> MacCount:
        arch, tokens = self.architecture, self.tokens
        embed, attn_dim = arch.embed_dim, arch.attn_dim
        per_block_attention = 2 * arch.num_heads * tokens**2 * arch.head_dim
        per_block_rest = tokens * embed * 3 * attn_dim + tokens * attn_dim * embed + 2 * tokens * embed * arch.mlp_hidden
        patch_embedding = self.patch_tokens * self.values_per_patch * embed
        head = embed * arch.head_outputs
        return MacCount(arch.depth * per_block_attention, patch_embedding + arch.depth * per_block_rest + head)


def parse_patch_sizes(text: str) -> list[int]:
    """'8,16,32' -> [8, 16, 32]; bad items are usage errors."""
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise UsageError("--patch-sizes is empty: give one or more patch sizes in pixels, e.g. --patch-sizes 8,16,32")
    sizes = []
    for item in items:
        try:
            sizes.append(int(item))
        except ValueError:
            raise UsageError(f"--patch-sizes: {item!r} is not a whole number of pixels (e.g. --patch-sizes 8,16,32)") from None
    return sizes


def plan_variants(architecture: Architecture, patch_sizes: list[int], image_size: int, pad: bool) -> list[Variant]:
    """The variants to compare, smallest patch first, always including the checkpoint's own patch size."""
    if image_size < 1:
        raise UsageError(f"--image-size must be at least 1 pixel, not {image_size}")
    for patch in patch_sizes:
        if not 1 <= patch <= image_size:
            raise UsageError(f"patch size must be between 1 and {image_size} (the image size), not {patch}")
        if image_size % patch and not pad:
            divisors = [size for size in range(1, image_size + 1) if image_size % size == 0]
            raise UsageError(
                f"patch size {patch} does not divide the {image_size}-pixel image ({image_size} / {patch} = "
                f"{image_size / patch:.2f}); use a divisor of {image_size} ({', '.join(map(str, divisors))}) "
                "or --pad to zero-pad the image to a multiple of the patch size as timm's dynamic_img_pad does"
            )
    if image_size % architecture.native_patch and not pad:
        raise UsageError(
            f"the checkpoint's own patch size {architecture.native_patch}, which every ratio is taken against, does not "
            f"divide the {image_size}-pixel image; choose an --image-size that is a multiple of it or pass --pad"
        )
    chosen = sorted(set(patch_sizes) | {architecture.native_patch})
    return [Variant(architecture, patch, image_size) for patch in chosen]


# ----- building variants and counting them with torch


def build_variant(variant: Variant, device: torch.device | str) -> VisionTransformer:
    """The architecture at this patch size, built for the padded image size; weights initialised by timm."""
    return timm.create_model(
        variant.architecture.name,
        pretrained=False,
        patch_size=variant.patch_size,
        img_size=variant.padded_size,
        device=device,
    ).eval()


def pad_to_patches(inputs: Tensor, patch_size: int) -> Tensor:
    """Zero-pad (B, C, H, W) on the right and bottom to multiples of patch_size: timm's dynamic_img_pad."""
    height, width = inputs.shape[-2:]
    return F.pad(inputs, (0, -width % patch_size, 0, -height % patch_size))


def count_variant(variant: Variant) -> tuple[MacCount, int]:
    """FlopCounterMode's count of one forward on the meta device, halved (bmm is the attention, everything else
    the rest), and the variant's parameter count."""
    net = build_variant(variant, "meta")
    for block in net.blocks:
        # The explicit q k^T and weights @ v are counted on every backend; fused kernels are not always.
        block.attn.fused_attn = False
    size = variant.image_size
    inputs = pad_to_patches(torch.zeros(1, variant.architecture.in_chans, size, size, device="meta"), variant.patch_size)
    with FlopCounterMode(display=False) as counter, torch.inference_mode():
        net(inputs)
    flops = {str(operator): count for operator, count in counter.get_flop_counts()["Global"].items()}
    attention = flops.pop("aten.bmm", 0)
    if any(count % 2 for count in (attention, *flops.values())):
        raise VitcliError(f"FlopCounterMode reported an odd FLOP count for patch {variant.patch_size}: {flops}")
    return MacCount(attention // 2, sum(flops.values()) // 2), sum(parameter.numel() for parameter in net.parameters())


# ----- measuring on the device


@dataclass(frozen=True)
class Measurement:
    batch_size: int
    runs: int
    warmup: int
    latencies_ms: list[float]  # each run's wall time for the whole batch
    peak_memory_bytes: int
    memory_method: str

    @property
    def latency_ms_per_image(self) -> float:
        return statistics.median(self.latencies_ms) / self.batch_size

    def to_json(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "runs": self.runs,
            "warmup": self.warmup,
            "median_latency_ms_per_image": self.latency_ms_per_image,
            "latencies_ms_per_batch": self.latencies_ms,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_method": self.memory_method,
        }


@dataclass(frozen=True)
class MeasureSettings:
    device: torch.device
    batch_size: int
    runs: int
    warmup: int
    seed: int


def measure_variants(variants: list[Variant], settings: MeasureSettings, progress: Callable[[str], None]) -> list[Measurement]:
    """Median forward wall time of each variant over `runs` after `warmup` forwards, and the peak memory of one
    more forward. The timed runs take turns (variant 1, 2, 3, 1, 2, 3, ...) so that other load on the machine
    falls on every variant alike rather than on whichever happened to run during it."""
    device, batch = settings.device, settings.batch_size
    torch.manual_seed(settings.seed)
    nets = [build_variant(variant, device) for variant in variants]
    size = variants[0].image_size
    images = torch.randn(batch, variants[0].architecture.in_chans, size, size, generator=torch.Generator().manual_seed(settings.seed))
    inputs = [pad_to_patches(images, variant.patch_size).to(device) for variant in variants]
    latencies: list[list[float]] = [[] for _ in variants]
    with torch.inference_mode():
        for net, batch_input in zip(nets, inputs):
            for _ in range(settings.warmup):
                net(batch_input)
        for run in range(settings.runs):
            progress(f"timing run {run + 1} of {settings.runs} (batch {batch}, every variant) on {device} ...")
            for times, net, batch_input in zip(latencies, nets, inputs):
                _synchronize(device)
                start = time.perf_counter()
                net(batch_input)
                _synchronize(device)
                times.append((time.perf_counter() - start) * 1000)
        peaks = [peak_forward_memory(net, batch_input, device) for net, batch_input in zip(nets, inputs)]
    return [
        Measurement(batch, settings.runs, settings.warmup, times, peak, method) for times, (peak, method) in zip(latencies, peaks)
    ]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def peak_forward_memory(net: nn.Module, inputs: Tensor, device: torch.device) -> tuple[int, str]:
    """Peak bytes one forward needs beyond what was allocated before it, and how it was measured."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        net(inputs)
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before, CUDA_MEMORY_METHOD
    with LiveTensorPeak() as tracker:
        net(inputs)
    return tracker.peak_bytes, TENSOR_MEMORY_METHOD


class LiveTensorPeak(TorchDispatchMode):
    """Tracks the storages that aten operators create and the largest total of them alive at once.

    torch has no peak-memory statistic for the CPU allocator, and the process RSS high-water mark cannot be reset
    and hides reuse of freed pages; weak references to storages see exactly the tensors the forward creates.
    """

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, tuple[Any, int]] = {}
        self.peak_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.multiprocessing.reductions import StorageWeakRef
        from torch.utils._pytree import tree_leaves

        result = func(*args, **(kwargs or {}))
        # Drop freed storages first: a new output may reuse a freed address.
        self._live = {address: entry for address, entry in self._live.items() if not entry[0].expired()}
        for tensor in tree_leaves(result):
            if isinstance(tensor, Tensor):
                storage = tensor.untyped_storage()
                self._live.setdefault(storage.data_ptr(), (StorageWeakRef(storage), storage.nbytes()))
        self.peak_bytes = max(self.peak_bytes, sum(nbytes for _, nbytes in self._live.values()))
        return result


# ----- the checkpoint at other patch sizes


@dataclass(frozen=True)
class AdaptedPrediction:
    top1_index: int
    top1_label: str
    top1_probability: float
    native_top1_probability: float  # probability of the class the unmodified checkpoint ranks first
    probabilities_sum: float


@dataclass(frozen=True)
class AdaptedRun:
    image: ImageSource
    native_top1_index: int  # the unmodified checkpoint's top-1 class at its own patch and image size
    native_top1_label: str
    native_logit_difference: float  # max |logit| difference, checkpoint adapted to its own patch vs itself; NaN if not run
    predictions: dict[int, AdaptedPrediction]  # by patch size

    def to_json(self) -> dict[str, Any]:
        return {
            "note": ADAPTED_NOTE,
            "image": self.image.to_json(),
            "native_top1_class_index": self.native_top1_index,
            "native_top1_label": self.native_top1_label,
            "native_logit_max_abs_difference": self.native_logit_difference,
        }


def adapt_net(net: VisionTransformer, variant: Variant) -> VisionTransformer:
    """A copy of the checkpoint at this patch size: timm's set_input_size resamples the patch-embedding kernel
    with the FlexiViT pseudo-inverse (resample_patch_embed) and the position embeddings to the new grid
    (resample_abs_pos_embed, bicubic). The shared network is never modified."""
    adapted = copy.deepcopy(net)
    adapted.set_input_size(img_size=(variant.padded_size, variant.padded_size), patch_size=(variant.patch_size, variant.patch_size))
    return adapted.eval()


def resized_input(model: VitModel, path: Path, image_size: int) -> Tensor:
    """The image through the checkpoint's eval transform at another size (its own crop fraction kept)."""
    config = {**model.data_config, "input_size": (3, image_size, image_size)}
    transform = timm.data.create_transform(**config, is_training=False)
    image, _ = load_rgb(path)
    return transform(image)


def adapt_and_predict(model: VitModel, variants: list[Variant], path: Path) -> AdaptedRun:
    """Each variant's prediction with the adapted checkpoint, and the largest |logit difference| between the
    checkpoint adapted to its own patch size and the checkpoint itself (should be 0)."""
    prepared = model.prepare(path)
    source = prepared.source
    image_size = variants[0].image_size
    image = prepared.input if image_size == model.data_config["input_size"][-1] else resized_input(model, path, image_size)
    reference = model.logits(prepared.input[None])[0]
    native_top1 = int(reference.argmax())
    predictions: dict[int, AdaptedPrediction] = {}
    native_difference = math.nan
    for variant in variants:
        adapted = adapt_net(model.net, variant)
        with torch.inference_mode():
            logits = adapted(pad_to_patches(image[None], variant.patch_size).to(model.device)).float().cpu()[0]
        probabilities = logits.softmax(dim=-1)
        top1 = int(probabilities.argmax())
        predictions[variant.patch_size] = AdaptedPrediction(
            top1, model.labels[top1], float(probabilities[top1]), float(probabilities[native_top1]), float(probabilities.sum())
        )
        if variant.patch_size == variant.architecture.native_patch and variant.image_size == variant.architecture.native_image:
            native_difference = float((logits - reference).abs().max())
    return AdaptedRun(source, native_top1, model.labels[native_top1], native_difference, predictions)


# ----- results


@dataclass
class PatchSizeRow:
    variant: Variant
    closed_form: MacCount
    counted: MacCount
    parameters: int
    measurement: Measurement | None = None
    adapted: AdaptedPrediction | None = None

    @property
    def relative_difference(self) -> float:
        """(FlopCounterMode MACs - closed-form MACs) / closed-form MACs."""
        return (self.counted.total - self.closed_form.total) / self.closed_form.total


@dataclass
class PatchSizeComparison:
    architecture: Architecture
    image_size: int
    pad: bool
    entries: list[PatchSizeRow]
    weights: str
    device: str | None = None
    threads: int | None = None
    adapted: AdaptedRun | None = None

    @property
    def note(self) -> str:
        return comparison_note(self.architecture.native_patch)

    @property
    def native(self) -> PatchSizeRow:
        return next(row for row in self.entries if row.variant.patch_size == self.architecture.native_patch)

    # -- ratios against the checkpoint's own patch size

    def ratio(self, row: PatchSizeRow, quantity: str) -> float:
        return getattr(row.variant, quantity) / getattr(self.native.variant, quantity)

    def mac_ratio(self, row: PatchSizeRow) -> float:
        return row.closed_form.total / self.native.closed_form.total

    def latency_ratio(self, row: PatchSizeRow) -> float:
        return row.measurement.latency_ms_per_image / self.native.measurement.latency_ms_per_image

    def memory_ratio(self, row: PatchSizeRow) -> float:
        native = self.native.measurement.peak_memory_bytes
        return row.measurement.peak_memory_bytes / native if native else math.nan

    # -- Result protocol

    def table(self) -> Group:
        arch = self.architecture
        native = arch.native_patch
        padding = " (--pad: zero-padded to a multiple of p)" if self.pad else ""
        tokens = Table(
            title=f"{arch.name} at {self.image_size}x{self.image_size}{padding}: tokens\n{self.note}",
            caption=f"* = patch {native}, the size the checkpoint was trained at",
        )
        for column in ("patch", "grid", "patch tokens n", "rows N (+prefix)", "values/patch 3p²", "patch-embed params", "all params"):
            tokens.add_column(column, justify="right")
        for row in self.entries:
            variant = row.variant
            tokens.add_row(
                _patch_label(variant), f"{variant.grid_side}x{variant.grid_side}", f"{variant.patch_tokens:,}",
                f"{variant.tokens:,}", f"{variant.values_per_patch:,}", f"{variant.patch_embedding_parameters:,}",
                f"{row.parameters:,}",
            )
        scores = Table(title=f"attention scores (N² with prefix rows, n² patches only)\n{self.note}")
        for column in (
            "patch", "N² per head·block", "n² per head·block", f"whole model (x{arch.num_heads} heads x{arch.depth} blocks)",
            f"N² vs p{native}", f"n² vs p{native}",
        ):
            scores.add_column(column, justify="right")
        for row in self.entries:
            variant = row.variant
            scores.add_row(
                _patch_label(variant), f"{variant.scores_per_head_block:,}", f"{variant.patch_scores_per_head_block:,}",
                f"{variant.scores_whole_model:,}", f"{self.ratio(row, 'scores_per_head_block'):.2f}",
                f"{self.ratio(row, 'patch_scores_per_head_block'):.2f}",
            )
        largest_difference = max(abs(row.relative_difference) for row in self.entries)
        compute = Table(
            title=f"millions of multiply-accumulates per image\nclosed form, and counted = FlopCounterMode FLOPs / 2\n{self.note}",
            caption="attention = q kᵀ and weights·v (grows with N²); rest = patch embedding, qkv, proj, MLP, head "
            f"(grows with N); largest |counted - closed| / closed: {largest_difference:.1e}",
        )
        for column in ("patch", "attention", "counted", "rest", "counted", "total", "counted", f"vs p{native}"):
            compute.add_column(column, justify="right")
        for row in self.entries:
            compute.add_row(
                _patch_label(row.variant), _millions(row.closed_form.attention), _millions(row.counted.attention),
                _millions(row.closed_form.rest), _millions(row.counted.rest), _millions(row.closed_form.total),
                _millions(row.counted.total), f"{self.mac_ratio(row):.2f}",
            )
        tables: list[Table] = [tokens, scores, compute]
        if self.entries[0].measurement is not None:
            first = self.entries[0].measurement
            measured = Table(
                title=f"measured on {self.device} (torch threads: {self.threads}): batch {first.batch_size}, median of "
                f"{first.runs} runs after {first.warmup} warm-up, random-init variants\n{self.note}",
                caption=f"peak memory: {first.memory_method}",
            )
            for column in ("patch", "rows N", "MMACs", f"vs p{native}", "ms / image", f"vs p{native}", "peak MiB", f"vs p{native}"):
                measured.add_column(column, justify="right")
            for row in self.entries:
                measurement = row.measurement
                measured.add_row(
                    _patch_label(row.variant), f"{row.variant.tokens:,}", _millions(row.closed_form.total),
                    f"{self.mac_ratio(row):.2f}", f"{measurement.latency_ms_per_image:.3f}", f"{self.latency_ratio(row):.2f}",
                    f"{measurement.peak_memory_bytes / 2**20:.2f}", f"{self.memory_ratio(row):.2f}",
                )
            tables.append(measured)
        if self.adapted is not None:
            run = self.adapted
            adapted = Table(
                title=f"{run.image.path}: the checkpoint at each patch size, {ADAPTED_NOTE}\n"
                f"(patch embedding resampled by pseudo-inverse, position embeddings resized{self._native_check()})",
                caption=f"p(native top-1) = probability of class {run.native_top1_index} ({run.native_top1_label}), "
                f"the unmodified checkpoint's top-1 at {arch.native_image} px, patch {native}",
            )
            for column in ("patch", "top-1 class", "label", "probability", "p(native top-1)"):
                adapted.add_column(column, justify="left" if column == "label" else "right")
            for row in self.entries:
                prediction = row.adapted
                adapted.add_row(
                    _patch_label(row.variant), str(prediction.top1_index), prediction.top1_label,
                    f"{prediction.top1_probability:.4f}", f"{prediction.native_top1_probability:.4f}",
                )
            tables.append(adapted)
        tables[-1].caption = "\n".join(filter(None, [tables[-1].caption, weights_caption(self.weights)]))
        return Group(*tables)

    def _native_check(self) -> str:
        difference = self.adapted.native_logit_difference
        if math.isnan(difference):
            return ""
        return f"; at p{self.architecture.native_patch} the logits differ from the checkpoint's by {difference:.2e}"

    def rows(self) -> list[dict[str, Any]]:
        return [self._row(row) for row in self.entries]

    def _row(self, row: PatchSizeRow) -> dict[str, Any]:
        variant = row.variant
        record: dict[str, Any] = {
            "comparison": self.note,
            "model": self.architecture.name,
            "image_size": self.image_size,
            "patch_size": variant.patch_size,
            "native": variant.patch_size == self.architecture.native_patch,
            "padding_pixels": variant.padding,
            "grid_rows": variant.grid_side,
            "grid_cols": variant.grid_side,
            "patch_tokens": variant.patch_tokens,
            "tokens_with_prefix": variant.tokens,
            "values_per_patch": variant.values_per_patch,
            "patch_embedding_parameters": variant.patch_embedding_parameters,
            "position_embedding_parameters": variant.position_embedding_parameters,
            "parameters": row.parameters,
            "scores_per_head_block": variant.scores_per_head_block,
            "patch_scores_per_head_block": variant.patch_scores_per_head_block,
            "scores_whole_model": variant.scores_whole_model,
            "patch_scores_whole_model": variant.patch_scores_whole_model,
            "scores_ratio_vs_native": self.ratio(row, "scores_per_head_block"),
            "patch_scores_ratio_vs_native": self.ratio(row, "patch_scores_per_head_block"),
            "macs_attention_closed_form": row.closed_form.attention,
            "macs_rest_closed_form": row.closed_form.rest,
            "macs_total_closed_form": row.closed_form.total,
            "macs_attention_counted": row.counted.attention,
            "macs_rest_counted": row.counted.rest,
            "macs_total_counted": row.counted.total,
            "macs_relative_difference": row.relative_difference,
            "macs_ratio_vs_native": self.mac_ratio(row),
        }
        if row.measurement is not None:
            record |= {
                "device": self.device,
                "threads": self.threads,
                "batch_size": row.measurement.batch_size,
                "runs": row.measurement.runs,
                "warmup": row.measurement.warmup,
                "latency_ms_per_image_median": row.measurement.latency_ms_per_image,
                "latency_ratio_vs_native": self.latency_ratio(row),
                "peak_memory_bytes": row.measurement.peak_memory_bytes,
                "peak_memory_ratio_vs_native": self.memory_ratio(row),
            }
        if row.adapted is not None:
            record |= {
                "adapted": ADAPTED_NOTE,
                "image": str(self.adapted.image.path),
                "top1_class_index": row.adapted.top1_index,
                "top1_label": row.adapted.top1_label,
                "top1_probability": row.adapted.top1_probability,
                "native_top1_probability": row.adapted.native_top1_probability,
            }
        record["weights"] = self.weights
        return record

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "comparison": self.note,
            "weights": self.weights,
            "architecture": self.architecture.to_json(),
            "image_size": self.image_size,
            "pad": PAD_NOTE if self.pad else False,
            "macs_method": {"closed_form": CLOSED_FORM_METHOD, "counted": FLOP_METHOD},
            "variants": [],
        }
        if self.adapted is not None:
            document["adapted"] = self.adapted.to_json()
        for row in self.entries:
            entry = {key: value for key, value in self._row(row).items() if key not in ("comparison", "model", "weights")}
            if row.measurement is not None:
                entry["measurement"] = row.measurement.to_json()
            document["variants"].append(entry)
        return document


def _patch_label(variant: Variant) -> str:
    native = "*" if variant.patch_size == variant.architecture.native_patch else ""
    return f"{variant.patch_size}{native}"


def _millions(macs: int) -> str:
    return f"{macs / 1e6:,.1f}"


# ----- the whole comparison


def compare_patch_sizes(
    variants: list[Variant],
    measure: MeasureSettings | None = None,
    adapt: tuple[VitModel, Path] | None = None,
    progress: Callable[[str], None] = lambda text: None,
) -> PatchSizeComparison:
    """Closed-form and FlopCounterMode counts for every variant (no image, no weights); with `measure`, latency
    and peak memory of random-init variants on the device; with `adapt`, the checkpoint resampled to each patch
    size and run on the image."""
    architecture = variants[0].architecture
    rows = []
    for variant in variants:
        progress(f"counting patch {variant.patch_size} ...")
        rows.append(PatchSizeRow(variant, variant.macs(), *count_variant(variant)))
    comparison = PatchSizeComparison(architecture, variants[0].image_size, any(variant.padding for variant in variants), rows, ARCHITECTURE_ONLY)
    if measure is not None:
        comparison.device, comparison.threads = str(measure.device), torch.get_num_threads()
        for row, measurement in zip(rows, measure_variants(variants, measure, progress)):
            row.measurement = measurement
    if adapt is not None:
        model, path = adapt
        progress(f"adapting the checkpoint to each patch size ({ADAPTED_NOTE}) ...")
        comparison.adapted = adapt_and_predict(model, variants, path)
        for row in rows:
            row.adapted = comparison.adapted.predictions[row.variant.patch_size]
        comparison.weights = model.spec.label
    return comparison


def architecture_provenance(architecture: Architecture) -> dict[str, Any]:
    """Provenance of a run that loaded no weights: the counts depend on the architecture and the versions only."""
    return {
        "model": architecture.name,
        "weights": {"source": "none", "note": "architecture only: the counts need no weights"},
        "versions": software_versions(),
    }


# ----- the chart


def chart(comparison: PatchSizeComparison) -> Any:
    """Tokens and attention scores (left) and multiply-accumulates (right) against patch size, log scales."""
    from vitcli.figures import plt, title

    patches = [row.variant.patch_size for row in comparison.entries]
    fig, (counts, compute) = plt.subplots(1, 2, figsize=(13, 5.6))
    series = [
        ("patch tokens n", [row.variant.patch_tokens for row in comparison.entries], "o-"),
        ("rows N = n + prefix", [row.variant.tokens for row in comparison.entries], "s--"),
        ("scores per head per block N²", [row.variant.scores_per_head_block for row in comparison.entries], "o-"),
        ("patch-only scores n²", [row.variant.patch_scores_per_head_block for row in comparison.entries], "s--"),
        ("scores whole model (x heads x blocks)", [row.variant.scores_whole_model for row in comparison.entries], "^-"),
    ]
    for label, values, style in series:
        counts.plot(patches, values, style, label=label)
        for patch, value in zip(patches, values):
            if style.endswith("-") and not style.endswith("--"):
                counts.annotate(f"{value:,}", (patch, value), textcoords="offset points", xytext=(5, 5), fontsize=7)
    counts.set_ylabel("count per image")
    counts.set_title("tokens and attention scores")
    closed = [
        ("attention q kᵀ and weights·v (∝ N²)", [row.closed_form.attention for row in comparison.entries], [row.counted.attention for row in comparison.entries]),
        ("rest: embedding, qkv, proj, MLP, head (∝ N)", [row.closed_form.rest for row in comparison.entries], [row.counted.rest for row in comparison.entries]),
        ("total", [row.closed_form.total for row in comparison.entries], [row.counted.total for row in comparison.entries]),
    ]
    for label, formula, counted in closed:
        line = compute.plot(patches, formula, "-", label=f"{label}: closed form")[0]
        compute.plot(patches, counted, "x", color=line.get_color(), markersize=10, label=f"{label}: FlopCounterMode / 2")
    for patch, total in zip(patches, closed[-1][1]):
        compute.annotate(f"{total / 1e6:,.1f} M", (patch, total), textcoords="offset points", xytext=(5, 5), fontsize=7)
    compute.set_ylabel("multiply-accumulates per image")
    compute.set_title("compute per image")
    for panel in (counts, compute):
        panel.set_xscale("log", base=2)
        panel.set_yscale("log")
        panel.set_xticks(patches, [f"{patch}{' (trained)' if patch == comparison.architecture.native_patch else ''}" for patch in patches])
        panel.minorticks_off()
        padded = ", zero-padded to a multiple of p" if comparison.pad else ""
        panel.set_xlabel(f"patch size p (pixels) on a {comparison.image_size}x{comparison.image_size} image{padded}")
        panel.grid(True, which="major", alpha=0.3)
        # Room for the value labels beside the outermost points, and legends below the axes, clear of the data.
        panel.margins(x=0.15, y=0.1)
        panel.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    title(fig, f"{comparison.architecture.name}: {comparison.note}", comparison.weights)
    fig.tight_layout()
    return fig
