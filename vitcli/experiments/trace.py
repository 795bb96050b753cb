"""The measured path from pixels to probabilities: every stage of the forward, kept for the followed tokens.

The forward is written out (channel-major patch rows times W_E, the prefix and position sums, per-head
softmax(q k^T * scale), the residual sums, the pooling and the head) so that every intermediate row can be shown:
the embedding and the readout here, the blocks in trace_stages.py.
Before, the model's own forward (timm, fused attention on) runs once, the capture layer keeping each module's first
input and output (capture.module_inputs_and_outputs); every kept row is compared with the capture of the timm
module that computes it, and the reconstructed logits with `model(x)`.
The result carries the largest differences; one over SELF_CHECK_TOLERANCE is an error. Both forwards run in full
float32 (TF32 off): on recent GPUs cuDNN convolutions use TF32 by default, which alone differs by about 1e-3.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from timm.layers import Attention, Mlp, resample_abs_pos_embed
from timm.models.vision_transformer import Block, VisionTransformer
from torch import Tensor, nn

from vitcli.errors import UsageError, VitcliError
from vitcli.experiments.results import ClassScore, top_classes
from vitcli.experiments.trace_stages import BlockSummary, FollowedToken, Stage, Tracer, capture_forward, run_blocks
from vitcli.grid import PatchGrid
from vitcli.images import ImageSource, load_rgb
from vitcli.model import PreparedImage, VitModel
from vitcli.spec import ascii_number

SELF_CHECK_TOLERANCE = 1e-4  # largest |explicit - timm's own| allowed for any kept value
READOUTS = {"token": "CLS row", "avg": "mean of the patch rows"}


@dataclass
class TraceResult:
    source: ImageSource
    weights: str
    model_name: str
    grid: PatchGrid
    followed: list[FollowedToken]
    opened_blocks: list[int]  # one-based blocks whose every stage is kept
    stages: list[Stage]
    embedding_norms: dict[str, float]  # norm of each followed row entering block 1
    blocks: list[BlockSummary]
    cls_cosine_to_block1: list[float]  # per block: cosine of the CLS output row with the CLS row leaving block 1
    pooling: str  # the model's own global_pool: "token" (CLS row) or "avg" (mean of the patch rows)
    top: list[ClassScore]
    max_error: float  # largest |explicit - forward-hook capture| over every kept row
    logits_error: float  # largest |reconstructed logits - model(x)|
    shown_values: int  # how many leading values tables and CSV rows show; documents keep every row in full


def parse_tokens(grid: PatchGrid, texts: Sequence[str]) -> list[FollowedToken]:
    """Tokens from `--token` values: comma-separated `0` or `cls`, prefix names (`r1`, `dist`), `63`, `P63`, `r4c6`."""
    followed: list[FollowedToken] = []
    for text in texts:
        for part in (piece.strip() for piece in text.split(",")):
            if not part:
                continue
            try:
                prefix = grid.prefix_token(part)
            except UsageError as error:
                raise UsageError(f"--token {part}: {error}") from error
            if prefix is not None or part == "0":
                entry = _token(grid, prefix or 0)
            else:
                try:
                    patch = grid.parse_patch(part)
                except UsageError as error:
                    names = ", ".join(["0", *(name.lower() for name in grid.prefix_names)])
                    prefixes = f"; or {names}" if grid.prefix_names else ""
                    raise UsageError(f"--token {part}: {error}{prefixes}") from error
                entry = FollowedToken(grid.token_of_patch(patch), f"P{patch}", patch)
            if entry not in followed:
                followed.append(entry)
    return followed or [_token(grid, 0)]


def _token(grid: PatchGrid, token: int) -> FollowedToken:
    """Token 0 is CLS, or P1 on a model without prefix tokens."""
    return FollowedToken(token, grid.token_name(token), grid.patch_of_token(token))


def parse_blocks(depth: int, texts: Sequence[str]) -> list[int]:
    """One-based blocks from `--blocks` values: `1`, `1,12`, `3-5`, `all` or `none`."""
    chosen: set[int] = set()
    for text in texts:
        for part in (piece.strip().lower() for piece in text.split(",")):
            if part in ("", "none"):
                continue
            if part == "all":
                chosen.update(range(1, depth + 1))
                continue
            first, _, last = part.partition("-")
            low, high = ascii_number(first), ascii_number(last or first)
            if low is None or high is None:
                raise UsageError(f"--blocks {part}: give block numbers 1..{depth}, ranges like 3-5, all or none")
            if not 1 <= low <= high <= depth:
                raise UsageError(f"--blocks {part}: this model has blocks 1..{depth} (counting from one)")
            chosen.update(range(low, high + 1))
    return sorted(chosen)


def require_traceable(net: nn.Module, name: str) -> VisionTransformer:
    """The trace writes out timm's VisionTransformer forward; subclasses and other block types would not match."""
    if type(net) is not VisionTransformer:
        raise VitcliError(f"cannot trace {name}: it is a {type(net).__name__}, whose forward differs from timm's ViT")
    if net.attn_pool is not None or net.global_pool not in READOUTS:
        raise VitcliError(f"cannot trace {name}: its pooling {net.global_pool!r} is not the CLS row or the mean")
    for index, block in enumerate(net.blocks):
        parts = (type(block) is Block, type(block.attn) is Attention, type(block.mlp) is Mlp)
        if not all(parts) or block.attn.gate is not None:
            raise VitcliError(
                f"cannot trace {name}: block {index + 1} is not timm's standard Block with Attention and Mlp"
            )
    return net


def trace_image(
    model: VitModel, image: PreparedImage, followed: list[FollowedToken], opened: list[int], shown_values: int = 3
) -> TraceResult:
    """Follow the given tokens through every stage of one image's forward; blocks in `opened` keep every stage."""
    if shown_values < 1:
        raise UsageError(f"--values must be at least 1, not {shown_values}")
    net = require_traceable(model.net, model.name)
    x = image.input.unsqueeze(0).to(model.device)
    with torch.inference_mode(), full_float32():
        captures, model_logits = capture_forward(net, x, set(opened))
        tracer = Tracer(model.grid, followed, captures)
        tokens = _embed(tracer, model, image, x)
        hidden, summaries, embedding_norms, cls_states = run_blocks(tracer, net, tokens, set(opened))
        logits = _readout(tracer, net, hidden)
    logits_error = float((logits - model_logits).abs().max())
    probabilities = logits.softmax(-1)
    tracer.whole("head.softmax", "softmax: probabilities", probabilities)
    top = top_classes(logits, probabilities, model.labels, 5)
    max_error = max([stage.error for stage in tracer.stages if stage.error is not None] + [s.error for s in summaries])
    if max(max_error, logits_error) > SELF_CHECK_TOLERANCE:
        raise VitcliError(
            f"trace self-check failed for {image.source.display_path}: the explicit forward differs from timm's own by "
            f"{max(max_error, logits_error):.3g} (tolerance {SELF_CHECK_TOLERANCE:g})"
        )
    first = cls_states[0]
    cls_cosine = [float(torch.nn.functional.cosine_similarity(state, first, dim=0)) for state in cls_states]
    return TraceResult(
        image.source, model.spec.label, model.name, model.grid, followed, sorted(opened), tracer.stages,
        embedding_norms, summaries, cls_cosine, net.global_pool, top, max_error, logits_error, shown_values,
    )  # fmt: skip


@contextmanager
def full_float32() -> Iterator[None]:
    """TF32 off for matmuls and cuDNN convolutions while explicit and fused computations are compared."""
    matmul, convolution = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, convolution


def _embed(tracer: Tracer, model: VitModel, image: PreparedImage, x: Tensor) -> Tensor:
    """Pixels to the rows entering block 1: flatten, project, join the prefix tokens, add position embeddings."""
    net, grid = model.net, model.grid
    decoded, _ = load_rgb(image.source.path)
    decoded_pixels = torch.from_numpy(np.array(decoded))
    decoded_name = f"decoded image (file mode {image.source.original_mode}; RGB values 0..255)"
    tracer.whole("image.decoded", decoded_name, decoded_pixels, leading_only=True)
    crop = torch.from_numpy(image.crop_uint8())
    tracer.whole("image.crop", "resized and centre-cropped input (RGB 0..255)", crop, leading_only=True)
    tracer.whole("image.normalized", "normalized tensor (channels first)", x[0], leading_only=True)
    pixels = model.flatten_patches(x)[0]
    tracer.patches("embed.pixels", "patch matrix (channel-major: R rows, then G, then B)", pixels)
    weight, bias = model.patch_projection
    projection = pixels @ weight + bias
    conv = tracer.capture("patch_embed.proj").flatten(1).T
    tracer.patches("embed.projection", "projection X W_E + b_E", projection, "patch_embed.proj", conv)
    if not isinstance(net.patch_embed.norm, nn.Identity):
        projection = net.patch_embed.norm(projection)
        captured = tracer.capture("patch_embed").reshape(grid.num_patches, -1)
        tracer.patches("embed.norm", "patch LayerNorm", projection, "patch_embed", captured)
    # In timm's order: CLS, DIST, registers; a model without any (SigLIP) has patch rows only.
    parameters = {"class token": net.cls_token, "distillation token": getattr(net, "dist_token", None),
                  "register tokens": net.reg_token}  # fmt: skip
    prefix = {name: token[0] for name, token in parameters.items() if token is not None}
    rows = projection
    if prefix:
        first, *others = prefix
        name = " and ".join([f"{first} parameter", *others])  # "class token parameter and register tokens"
        prefix_rows = tracer.prefix("embed.prefix", name, torch.cat(list(prefix.values())))
        rows = torch.cat([prefix_rows, projection])
    if net.pos_embed is not None:
        position = net.pos_embed
        if net.dynamic_img_size:
            position = resample_abs_pos_embed(
                position, new_size=(grid.rows, grid.cols), old_size=net.patch_embed.grid_size,
                num_prefix_tokens=0 if net.no_embed_class else net.num_prefix_tokens,
            )  # fmt: skip
        position = position[0]
        if net.no_embed_class:
            # DeiT-3 and DINOv2 style: position embeddings cover the patches only; the prefix rows get none.
            tracer.patches("embed.position", "position embedding (patches only)", position)
            position = torch.cat([position.new_zeros(grid.num_prefix, position.shape[1]), position])
        else:
            tracer.tokens("embed.position", "position embedding", position)
        rows = rows + position
    rows = tracer.tokens("embed.tokens", "prefix + patches + position: the rows entering block 1", rows, "pos_drop")
    if not isinstance(net.norm_pre, nn.Identity):
        rows = tracer.tokens("embed.norm_pre", "pre-block LayerNorm", net.norm_pre(rows), "norm_pre")
    return rows


def _readout(tracer: Tracer, net: VisionTransformer, hidden: Tensor) -> Tensor:
    """Final LayerNorm, the model's own pooling, fc_norm and the head: the logits, written out."""
    normed = tracer.tokens("final.norm", "final LayerNorm", net.norm(hidden), "norm")
    if net.global_pool == "token":
        pooled = normed[0]
    else:
        pooled = (normed if net.pool_include_prefix else normed[net.num_prefix_tokens :]).mean(0)
    tracer.whole("final.pooled", f"readout: {READOUTS[net.global_pool]}", pooled, "fc_norm", "input")
    if not isinstance(net.fc_norm, nn.Identity):
        pooled = tracer.whole("final.fc_norm", "readout LayerNorm (fc_norm)", net.fc_norm(pooled), "fc_norm")
    logits = pooled @ net.head.weight.T + net.head.bias
    return tracer.whole("head.logits", f"head: logits ({logits.numel()} classes)", logits, "head").float().cpu()
