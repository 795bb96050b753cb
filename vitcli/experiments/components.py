"""The named sites of a pre-norm timm ViT as context-managed forward hooks, in TransformerLens's vocabulary.

A timm `Block` computes x + drop_path1(ls1(attn(norm1(x)))), then + drop_path2(ls2(mlp(norm2(x)))). The sites
(blocks count from 1, as everywhere in vitcli):

    blocks.B.hook_resid_pre      (batch, tokens, width)     the rows entering block B
    blocks.B.ln1.hook_normalized (batch, tokens, width)     norm1's output: what the attention reads
    blocks.B.attn.hook_z         (batch, tokens, heads, d)  every head's output: the input of attn.proj, split by
                                                            head (proj(z) = sum over heads of z_h W_O,h^T + b_O)
    blocks.B.hook_attn_out       (batch, tokens, width)     what the attention sublayer adds to the residual, with
                                                            layer scale ls1 and drop path as the model applies them
    blocks.B.hook_mlp_out        (batch, tokens, width)     the same for the MLP sublayer (ls2, drop_path2)
    blocks.B.hook_resid_post     (batch, tokens, width)     the rows leaving block B
    blocks.B.attn.hook_pattern   (batch, heads, tokens, tokens) softmax(q k^T * scale): the attention probabilities
                                                            (the block runs timm's non-fused path while hooked)

`hooks(net, {site: function})` calls function(activation) during every forward inside the `with`; a function that
returns a tensor replaces the activation (same shape), one that returns None only reads it. `caching(net, sites)`
keeps activations in a dict (the very tensors the rest of the forward reads, so gradients with respect to them can be
taken). `replaced(activation, edits)` changes `Part`s of a batch (a row, one token or every token, one head or the
whole width) for a hook to return, and `logits_from(net, block, rows)` runs the model's own forward on from rows at
blocks.B.hook_resid_pre. Hooks are removed on leaving the `with`, whatever happens.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from timm.models.vision_transformer import Block
from torch import Tensor, nn

from vitcli.errors import UsageError

# What the sites need of every block: the pre-norm layout's modules by their timm names.
REQUIRED_MODULES = ("norm1", "attn", "attn.qkv", "attn.proj", "ls1", "drop_path1", "norm2", "mlp", "ls2", "drop_path2")
_SITE = re.compile(
    r"^blocks\.(\d+)\.(hook_resid_pre|ln1\.hook_normalized|attn\.hook_z|attn\.hook_pattern|hook_attn_out|hook_mlp_out|"
    r"hook_resid_post)$",
    re.ASCII,
)

Hook = Callable[[Tensor], Tensor | None]


def pre_norm_refusal(net: nn.Module, name: str) -> str | None:
    """Why `net`'s blocks are not timm's pre-norm layout (naming the missing modules), or None when they are.

    Works on a meta-device skeleton, so commands refuse a model before its weights load."""
    for index, block in enumerate(net.blocks):
        missing = [path for path in REQUIRED_MODULES if _module(block, path) is None]
        if missing:
            return (
                f"{name} is not a pre-norm ViT vitcli can take apart: block {index + 1} "
                f"({type(block).__name__}) has no {', '.join(missing)}"
            )
        if not isinstance(block, Block):
            return (
                f"{name} is not a pre-norm ViT vitcli can take apart: block {index + 1} is a {type(block).__name__}, "
                "not timm's pre-norm Block"
            )
    return None


def require_pre_norm(model_name: str) -> nn.Module:
    """The meta skeleton of `model_name`, refused with UsageError unless its blocks are the pre-norm layout."""
    from vitcli.loading import require_vit

    skeleton = require_vit(model_name)
    refusal = pre_norm_refusal(skeleton, model_name)
    if refusal is not None:
        raise UsageError(refusal)
    return skeleton


def _module(root: nn.Module, path: str) -> nn.Module | None:
    for part in path.split("."):
        root = getattr(root, part, None)
        if not isinstance(root, nn.Module):
            return None
    return root


def resid_pre_site(block: int) -> str:
    return f"blocks.{block}.hook_resid_pre"


def head_site(block: int) -> str:
    return f"blocks.{block}.attn.hook_z"


def pattern_site(block: int) -> str:
    return f"blocks.{block}.attn.hook_pattern"


def sublayer_site(block: int, sublayer: str) -> str:
    """sublayer 'attn' or 'mlp'."""
    return f"blocks.{block}.hook_{sublayer}_out"


@contextmanager
def hooks(net: nn.Module, functions: Mapping[str, Hook]) -> Iterator[None]:
    """Run every forward inside the `with` with these functions at their sites (see the module's docstring)."""
    handles = []
    try:
        for site, function in functions.items():
            handles.append(_register(net, site, function))
        yield
    finally:
        for handle in reversed(handles):  # last on, first off: a block's fused_attn comes back as it was
            handle.remove()


@contextmanager
def caching(net: nn.Module, sites: Sequence[str]) -> Iterator[dict[str, Tensor]]:
    """The activations at `sites` of the last forward inside the `with`, by site name."""
    cache: dict[str, Tensor] = {}

    def keeper(site: str) -> Hook:
        def keep(activation: Tensor) -> Tensor:
            cache[site] = activation
            return activation  # what follows reads the cached tensor itself (at hook_z a view made by the hook)

        return keep

    with hooks(net, {site: keeper(site) for site in sites}):
        yield cache


@dataclass(frozen=True)
class Part:
    """Part of one batch row of a site's activation: one token (None: every token) and, at attn.hook_z, one head
    (one-based; None: every head, the whole width)."""

    row: int
    token: int | None = None
    head: int | None = None

    @property
    def within_row(self) -> tuple[Any, ...]:
        """The index of this part in one row (tokens, ...) of the activation."""
        return (slice(None) if self.token is None else self.token, ... if self.head is None else self.head - 1)


def replaced(activation: Tensor, edits: Iterable[tuple[Part, Callable[[Tensor], Tensor]]]) -> Tensor:
    """A copy of a (batch, tokens, ...) activation with each part set to function(the part's value), in turn."""
    activation = activation.clone()
    for part, function in edits:
        where = (part.row, *part.within_row)
        activation[where] = function(activation[where])
    return activation


def logits_from(net: nn.Module, block: int, rows: Tensor) -> Tensor:
    """The model's own forward on from `rows` entering block `block` (one-based: the value of hook_resid_pre)."""
    return net.forward_head(net.norm(net.blocks[block - 1 :](rows)))


def _register(net: nn.Module, site: str, function: Hook) -> Any:
    match = _SITE.match(site)
    if match is None:
        raise ValueError(f"unknown site {site!r}")
    number, kind = int(match.group(1)), match.group(2)
    if not 1 <= number <= len(net.blocks):
        raise ValueError(f"site {site!r}: blocks are 1..{len(net.blocks)}")
    block = net.blocks[number - 1]
    if kind == "hook_resid_pre":
        return block.register_forward_pre_hook(_on_input(function))
    if kind == "attn.hook_pattern":
        return _PatternHandle(block.attn, function)
    if kind == "attn.hook_z":
        heads = block.attn.num_heads
        return block.attn.proj.register_forward_pre_hook(_on_input(function, split_heads=heads))
    module = {
        "ln1.hook_normalized": block.norm1,
        "hook_attn_out": block.drop_path1,
        "hook_mlp_out": block.drop_path2,
        "hook_resid_post": block,
    }[kind]
    return module.register_forward_hook(lambda _module, _inputs, output: function(output))


def _on_input(function: Hook, split_heads: int | None = None) -> Callable[..., Any]:
    """A forward pre-hook giving `function` the module's first input (split into heads when asked)."""

    def pre_hook(_module: nn.Module, inputs: tuple[Any, ...]) -> tuple[Any, ...] | None:
        activation = inputs[0]
        if split_heads is not None:
            activation = activation.unflatten(-1, (split_heads, -1))
        replaced = function(activation)
        if replaced is None:
            return None
        if split_heads is not None:
            replaced = replaced.flatten(-2)
        return (replaced, *inputs[1:])

    return pre_hook


class _PatternHandle:
    """The attention probabilities at `attn.attn_drop`, which timm calls only on its non-fused path: the attention
    runs non-fused while the hook is on (the logits move by at most 1e-6, ../shared/NOTES.md), fused again after."""

    def __init__(self, attention: nn.Module, function: Hook):
        self.attention = attention
        self.was_fused = attention.fused_attn
        attention.fused_attn = False
        self.handle = attention.attn_drop.register_forward_hook(lambda _module, _inputs, output: function(output))

    def remove(self) -> None:
        self.handle.remove()
        self.attention.fused_attn = self.was_fused
