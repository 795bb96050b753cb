"""The measured path from pixels to probabilities: every stage of the forward, kept for the followed tokens.

The forward is written out here (channel-major patch rows times W_E, the prefix and position sums, per-head
softmax(q k^T * scale), the residual sums, the pooling and the head) so that every intermediate row can be shown.
Before, the model's own forward (timm, fused attention on) runs once, the capture layer keeping each module's first
input and output (capture.module_inputs_and_outputs); every kept row is compared with the capture of the timm
module that computes it, and the reconstructed logits with `model(x)`.
The result carries the largest differences; one over SELF_CHECK_TOLERANCE is an error. Both forwards run in full
float32 (TF32 off): on recent GPUs cuDNN convolutions use TF32 by default, which alone differs by about 1e-3.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from timm.layers import Attention, Mlp, resample_abs_pos_embed
from timm.models.vision_transformer import Block, VisionTransformer
from torch import Tensor, nn

from vitcli.capture import module_inputs_and_outputs
from vitcli.errors import UsageError, VitcliError
from vitcli.experiments.predict import ClassScore, top_classes
from vitcli.grid import PatchGrid
from vitcli.images import ImageSource, load_rgb
from vitcli.model import PreparedImage, VitModel
from vitcli.spec import ascii_number

SELF_CHECK_TOLERANCE = 1e-4  # largest |explicit - timm's own| allowed for any kept value
LEADING_KEPT = 64  # whole-image stages (150k values) keep only their first values; every row is kept in full
READOUTS = {"token": "CLS row", "avg": "mean of the patch rows"}


@dataclass(frozen=True)
class FollowedToken:
    token: int  # index among all rows (CLS is 0)
    name: str  # "CLS", "R1", "P63"
    patch: int | None


@dataclass
class Stage:
    """One intermediate of the forward. Rows are full vectors; `values` holds a stage that is not per token."""

    key: str  # stable name for scripts: "embed.projection", "block1.head2.q", "head.logits"
    name: str  # what a person reads
    shape: tuple[int, ...]  # the whole tensor for one image
    block: int | None = None  # one-based
    head: int | None = None  # one-based
    module: str | None = None  # the timm module whose capture this was checked against
    rows: dict[str, list[float]] | None = None  # followed token name -> its row (only tokens this stage has)
    values: list[float] | None = None  # the whole tensor flattened, or its first LEADING_KEPT values if larger
    error: float | None = None  # largest |explicit - capture| over what is kept; None where no module computes it


@dataclass
class BlockSummary:
    block: int  # one-based
    output_rows: dict[str, list[float]]  # followed token name -> the row leaving the block
    norms: dict[str, float]  # L2 norm of each followed output row
    cosine_to_previous: dict[str, float]  # cosine of each output row with the same row entering the block
    error: float  # largest |explicit - the block's own output| over the followed rows


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
        captures, model_logits = _capture(net, x, set(opened))
        tracer = _Tracer(model.grid, followed, captures)
        tokens = _embed(tracer, model, image, x)
        hidden, summaries, embedding_norms, cls_states = _run_blocks(tracer, net, tokens, set(opened))
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


def _capture(net: VisionTransformer, x: Tensor, opened: set[int]) -> tuple[dict[str, tuple[Tensor, Tensor]], Tensor]:
    """The model's own forward through the capture layer: name -> (first input, output) of every module outside the
    blocks, of every block, and of every module inside the opened blocks; and the logits."""
    names = []
    for name, _module in net.named_modules():
        parts = name.split(".")
        inside_closed_block = parts[0] == "blocks" and len(parts) > 2 and int(parts[1]) + 1 not in opened
        if name and not inside_closed_block:
            names.append(name)
    with module_inputs_and_outputs(net, names) as kept:
        logits = net(x).float().cpu()[0]
    captures = {
        name: (inputs.detach().float().cpu(), output.detach().float().cpu()) for name, (inputs, output) in kept.items()
    }
    return captures, logits


class _Tracer:
    """Keeps the followed rows of each stage and compares them with the capture of the timm module."""

    def __init__(self, grid: PatchGrid, followed: list[FollowedToken], captures: dict[str, tuple[Tensor, Tensor]]):
        self.grid = grid
        self.followed = followed
        self.captures = captures
        self.stages: list[Stage] = []

    def capture(self, module: str, side: str = "output") -> Tensor:
        """The capture of a module as a (rows, features) tensor for the one image."""
        inputs, output = self.captures[module]
        return (inputs if side == "input" else output)[0]

    def tokens(self, key, name, rows: Tensor, module=None, side="output", block=None, head=None, reference=None):
        """A (tokens, features) stage: the followed tokens' rows, checked against a module's capture."""
        if reference is None and module is not None:
            reference = self.capture(module, side).reshape(rows.shape)
        return self._keep(key, name, rows, {f.name: f.token for f in self.followed}, module, block, head, reference)

    def patches(self, key, name, rows: Tensor, module=None, reference=None):
        """A (patches, features) stage: only followed patches have a row here."""
        indices = {f.name: f.patch - 1 for f in self.followed if f.patch is not None}
        return self._keep(key, name, rows, indices, module, None, None, reference)

    def prefix(self, key, name, rows: Tensor):
        """A (prefix tokens, features) stage, such as the class token parameter: only followed prefix tokens."""
        indices = {f.name: f.token for f in self.followed if f.patch is None}
        return self._keep(key, name, rows, indices, None, None, None, None)

    def whole(self, key, name, tensor: Tensor, module=None, side="output", leading_only=False) -> Tensor:
        """A stage that is not per token (an image, the pooled row, the logits): its values in memory order."""
        error = None
        if module is not None:
            reference = self.capture(module, side).reshape(tensor.shape)
            error = float((tensor.float().cpu() - reference).abs().max())
        flat = tensor.detach().float().cpu().reshape(-1)
        values = flat[:LEADING_KEPT] if leading_only else flat
        self.stages.append(Stage(key, name, tuple(tensor.shape), None, None, module, None, values.tolist(), error))
        return tensor

    def _keep(self, key, name, rows, indices, module, block, head, reference) -> Tensor:
        kept = {token: rows[index].detach().float().cpu() for token, index in indices.items()}
        error = None
        if reference is not None and kept:
            error = max(float((row - reference[indices[token]]).abs().max()) for token, row in kept.items())
        plain = {token: row.tolist() for token, row in kept.items()}
        self.stages.append(Stage(key, name, tuple(rows.shape), block, head, module, plain, None, error))
        return rows


def _embed(tracer: _Tracer, model: VitModel, image: PreparedImage, x: Tensor) -> Tensor:
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


def _run_blocks(tracer: _Tracer, net: VisionTransformer, hidden: Tensor, opened: set[int]):
    """Every block over all rows; opened blocks keep every stage, the others only their output rows."""
    summaries: list[BlockSummary] = []
    embedding_norms = {f.name: float(hidden[f.token].norm()) for f in tracer.followed}
    cls_states = []
    for index, block in enumerate(net.blocks):
        number = index + 1
        output = _block(tracer if number in opened else None, block, hidden, number)
        reference = tracer.capture(f"blocks.{index}")
        rows = {f.name: output[f.token].float().cpu() for f in tracer.followed}
        previous = {f.name: hidden[f.token].float().cpu() for f in tracer.followed}
        summaries.append(
            BlockSummary(
                number,
                {token: row.tolist() for token, row in rows.items()},
                {token: float(row.norm()) for token, row in rows.items()},
                {token: _cosine(row, previous[token]) for token, row in rows.items()},
                max(float((output[f.token].cpu() - reference[f.token]).abs().max()) for f in tracer.followed),
            )
        )
        cls_states.append(output[0].float().cpu())
        hidden = output
    return hidden, summaries, embedding_norms, cls_states


def _block(tracer: _Tracer | None, block: Block, hidden: Tensor, number: int) -> Tensor:
    """One pre-LN block written out; with a tracer, every stage's followed rows are kept and checked."""
    prefix = f"blocks.{number - 1}"
    attention = block.attn

    def keep(key: str, name: str, rows: Tensor, module: str | None, side: str = "output", head=None, reference=None):
        """module is relative to the block ("" is the block itself); None where no module computes the stage."""
        if tracer is not None:
            module_name = None if module is None else f"{prefix}.{module}".rstrip(".")
            tracer.tokens(f"block{number}.{key}", name, rows, module_name, side, number, head, reference)
        return rows

    tokens = hidden.shape[0]
    normed = keep("norm1", "LayerNorm (norm1)", block.norm1(hidden), "norm1")
    qkv = attention.qkv(normed).reshape(tokens, 3, attention.num_heads, attention.head_dim).permute(1, 2, 0, 3)
    q, k, v = attention.q_norm(qkv[0]), attention.k_norm(qkv[1]), qkv[2]
    weights = (q @ k.transpose(-2, -1) * attention.scale).softmax(dim=-1)
    messages = weights @ v
    joined = messages.transpose(0, 1).reshape(tokens, attention.attn_dim)
    if tracer is not None:
        captured_qkv = tracer.capture(f"{prefix}.attn.qkv").reshape(tokens, 3, attention.num_heads, -1)
        captured_joined = tracer.capture(f"{prefix}.attn.norm", "input")
        for head in range(attention.num_heads):
            one = head + 1
            for position, (part, rows) in enumerate((("q", q[head]), ("k", k[head]), ("v", v[head]))):
                module, reference = "attn.qkv", captured_qkv[:, position, head]
                if part != "v" and not isinstance(getattr(attention, f"{part}_norm"), nn.Identity):
                    # With qk_norm the model attends with the normalized q and k: check those.
                    module = f"attn.{part}_norm"
                    reference = tracer.capture(f"{prefix}.{module}")[head]
                keep(f"head{one}.{part}", f"{part} (head {one})", rows, module, head=one, reference=reference)
            keep(f"head{one}.attention", f"attention weights softmax(q k^T * {attention.scale:.4g}) (head {one})",
                 weights[head], None, head=one)  # fmt: skip
            columns = slice(head * attention.head_dim, (one) * attention.head_dim)
            keep(f"head{one}.message", f"message: weights @ v (head {one})", messages[head], "attn.norm", "input",
                 head=one, reference=captured_joined[:, columns])  # fmt: skip
    keep("attn.joined", "heads joined", joined, "attn.norm", "input")
    if not isinstance(attention.norm, nn.Identity):
        joined = keep("attn.norm", "attention-output LayerNorm", attention.norm(joined), "attn.norm")
    update = keep("attn.proj", "output projection", attention.proj(joined), "attn.proj")
    if not isinstance(block.ls1, nn.Identity):
        update = keep("ls1", "LayerScale (ls1)", block.ls1(update), "ls1")
    hidden = keep("residual1", "residual sum: input + attention update", hidden + update, "norm2", "input")
    normed = keep("norm2", "LayerNorm (norm2)", block.norm2(hidden), "norm2")
    mlp = block.mlp
    inner = keep("mlp.fc1", "MLP hidden (fc1)", mlp.fc1(normed), "mlp.fc1")
    inner = keep("mlp.act", f"MLP activated ({type(mlp.act).__name__})", mlp.act(inner), "mlp.act")
    if not isinstance(mlp.norm, nn.Identity):
        inner = keep("mlp.norm", "MLP LayerNorm", mlp.norm(inner), "mlp.norm")
    update = keep("mlp.fc2", "MLP update (fc2)", mlp.fc2(inner), "mlp.fc2")
    if not isinstance(block.ls2, nn.Identity):
        update = keep("ls2", "LayerScale (ls2)", block.ls2(update), "ls2")
    return keep("output", "residual sum: the rows leaving the block", hidden + update, "")


def _readout(tracer: _Tracer, net: VisionTransformer, hidden: Tensor) -> Tensor:
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


def _cosine(a: Tensor, b: Tensor) -> float:
    denominator = float(a.norm() * b.norm())
    return float(a @ b) / denominator if denominator > 0 else math.nan
