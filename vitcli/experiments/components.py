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

`hooks(net, {site: function})` calls function(activation) during every forward inside the `with`; a function that
returns a tensor replaces the activation (same shape), one that returns None only reads it. `caching(net, sites)`
keeps activations in a dict. Hooks are removed on leaving the `with`, whatever happens.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from timm.models.vision_transformer import Block
from torch import Tensor, nn

from vitcli.errors import UsageError

# What the sites need of every block: the pre-norm layout's modules by their timm names.
REQUIRED_MODULES = ("norm1", "attn", "attn.qkv", "attn.proj", "ls1", "drop_path1", "norm2", "mlp", "ls2", "drop_path2")
_SITE = re.compile(
    r"^blocks\.(\d+)\.(hook_resid_pre|ln1\.hook_normalized|attn\.hook_z|hook_attn_out|hook_mlp_out|hook_resid_post)$"
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


def head_site(block: int) -> str:
    return f"blocks.{block}.attn.hook_z"


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
        for handle in handles:
            handle.remove()


@contextmanager
def caching(net: nn.Module, sites: Sequence[str]) -> Iterator[dict[str, Tensor]]:
    """The activations at `sites` of the last forward inside the `with`, by site name."""
    cache: dict[str, Tensor] = {}

    def keeper(site: str) -> Hook:
        def keep(activation: Tensor) -> None:
            cache[site] = activation

        return keep

    with hooks(net, {site: keeper(site) for site in sites}):
        yield cache


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
