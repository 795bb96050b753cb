"""What `vitcli trace` keeps of each stage, and the blocks written out stage by stage.

The model's own forward runs first through the capture layer (capture_forward); the Tracer then keeps the followed
tokens' rows of every explicit stage and compares each with the capture of the timm module that computes it. The
embedding and the readout, which differ between checkpoints, are written out in trace.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from timm.models.vision_transformer import Block, VisionTransformer
from torch import Tensor, nn

from vitcli.capture import module_inputs_and_outputs
from vitcli.grid import PatchGrid

LEADING_KEPT = 64  # whole-image stages (150k values) keep only their first values; every row is kept in full


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


def capture_forward(
    net: VisionTransformer, x: Tensor, opened: set[int]
) -> tuple[dict[str, tuple[Tensor, Tensor]], Tensor]:
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


class Tracer:
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


def run_blocks(tracer: Tracer, net: VisionTransformer, hidden: Tensor, opened: set[int]):
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


def _block(tracer: Tracer | None, block: Block, hidden: Tensor, number: int) -> Tensor:
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


def _cosine(a: Tensor, b: Tensor) -> float:
    denominator = float(a.norm() * b.norm())
    return float(a @ b) / denominator if denominator > 0 else math.nan
