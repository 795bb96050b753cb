"""How many values a trace holds, told from the model's modules before the weights load, and the bound on it.

A trace keeps every followed token's full row at every stage of each opened block (the attention weights alone are
a row over all tokens per head), and its table and CSV show `--values` leading values of every row (the CSV pads each
row to that width). Both grow with tokens x opened blocks, the second also with `--values`: all 197 tokens of ViT-Tiny
through all 12 blocks with `--values 1000` would hold about 71 million values (9.7 GB of memory, 650 MB written).

The count follows the trace's stages from the model's modules (its optional norms and LayerScales included); it
counts every per-token stage for every followed row (the class token has no patch pixels), so it is an upper bound,
within a few percent; tests/test_trace.py holds it to that on two architectures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from vitcli.errors import UsageError
from vitcli.experiments.trace_stages import LEADING_KEPT
from vitcli.grid import PatchGrid

# Measured with --weights random on ViT-Tiny (docs/commands/trace.md): about 165 bytes of memory and 35 bytes
# written per value; the largest traces the bound allows took 200-330 MB above a one-token trace and wrote 17-69 MB.
TRACE_VALUE_BOUND = 2_000_000
IMAGE_STAGES_KEPT = 3 * LEADING_KEPT  # the decoded image, the crop and the normalized tensor keep their first values


@dataclass(frozen=True)
class TraceSize:
    tokens: int
    opened: int
    shown: int  # --values
    per_opened_block: int  # full-row values per token in one opened block
    per_token_other: int  # full-row values per token outside the opened blocks (embedding, summaries, readout)
    rows_per_token: int  # table and CSV rows per token
    whole: int  # values of the stages that are not per token (image excerpts, pooled row, logits, probabilities)
    whole_rows: int

    @property
    def kept(self) -> int:
        return self.tokens * (self.opened * self.per_opened_block + self.per_token_other) + self.whole

    @property
    def rows(self) -> int:
        return self.tokens * self.rows_per_token + self.whole_rows

    @property
    def total(self) -> int:
        return self.kept + self.rows * self.shown


def trace_size(net: Any, grid: PatchGrid, classes: int, tokens: int, opened: int, shown: int) -> TraceSize:
    """The values a trace of `tokens` followed rows with `opened` blocks opened and `--values shown` holds, at most:
    counted from the network's modules (a meta-device skeleton will do), stage by stage as the trace keeps them."""
    block = net.blocks[0]
    width, heads, hidden = net.embed_dim, block.attn.num_heads, block.mlp.fc1.out_features
    per_head = 4 * block.attn.head_dim + grid.num_tokens  # q, k, v, the message; the attention over every token
    # norm1, joined, projection, residual, norm2, fc2, output (+ attention norm, ls1, ls2); fc1, activation (+ norm)
    optional_widths = _present(block.attn.norm, block.ls1, block.ls2)
    optional_hidden = _present(block.mlp.norm)
    per_block = heads * per_head + (7 + optional_widths) * width + (2 + optional_hidden) * hidden
    block_rows = 5 * heads + 9 + optional_widths + optional_hidden
    # a patch's pixels, projection, position, sum, final norm (+ patch norm, pre-block norm); one row per block
    optional_embedding = _present(net.patch_embed.norm, net.norm_pre)
    other = 3 * grid.patch_size**2 + (4 + optional_embedding + len(net.blocks)) * width
    rows_per_token = opened * block_rows + 5 + optional_embedding + len(net.blocks)
    # the image excerpts, the pooled row (+ fc_norm), the logits and the probabilities
    optional_readout = _present(net.fc_norm)
    whole = IMAGE_STAGES_KEPT + (1 + optional_readout) * width + 2 * classes
    return TraceSize(tokens, opened, shown, per_block, other, rows_per_token, whole, 6 + optional_readout)


def _present(*modules: nn.Module) -> int:
    """How many of these optional modules the model has (timm puts an Identity where one is absent)."""
    return sum(not isinstance(module, nn.Identity) for module in modules)


def check_trace_bound(size: TraceSize) -> None:
    """Refuse a trace above TRACE_VALUE_BOUND, with its arithmetic."""
    if size.total <= TRACE_VALUE_BOUND:
        return
    tokens = f"{size.tokens} token{'s' if size.tokens != 1 else ''}"
    blocks = f"{size.opened} opened block{'s' if size.opened != 1 else ''}"
    raise UsageError(
        f"trace: {tokens} x {blocks} would hold up to {size.total:,} "
        f"values ({tokens} x ({size.opened} x {size.per_opened_block:,} + {size.per_token_other:,}) in full rows, "
        f"plus {size.rows:,} rows x --values {size.shown} shown), above the bound of {TRACE_VALUE_BOUND:,}; "
        "pass fewer --token, --blocks or --values"
    )
