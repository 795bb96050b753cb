"""The named sites of every family, in TransformerLens's vocabulary, as context-managed hooks.

Block sites (blocks count from 1 over all stages, as everywhere in vitcli):

    blocks.B.hook_resid_pre      (batch, tokens, width)          the rows entering block B
    blocks.B.ln1.hook_normalized (batch, tokens, width)          the first norm's output: what the attention reads
    blocks.B.ln2.hook_normalized (batch, tokens, width)          the second norm's output: what the MLP reads
                                                                  (timm's ViT and Swin)
    blocks.B.attn.hook_q / hook_k / hook_v (batch, tokens, heads, d) per head, q and k after any q/k norm and rotary
                                                                  embedding: what the scores are made of
    blocks.B.attn.hook_pattern   (batch, heads, tokens, tokens)  the attention probabilities (the block runs its
                                                                  family's non-fused path while hooked)
    blocks.B.attn.hook_z         (batch, tokens, heads, d)       every head's output: the input of the output
                                                                  projection, split by head
    blocks.B.hook_attn_out       (batch, tokens, width)          what the attention sublayer adds to the residual
                                                                  (with layer scale and drop path as applied)
    blocks.B.hook_mlp_out        (batch, tokens, width)          the same for the MLP sublayer
    blocks.B.hook_resid_post     (batch, tokens, width)          the rows leaving block B

Model sites: `embed.hook_patches` (batch, patches, width) the patch embeddings before prefix tokens and positions;
`ln_final.hook_normalized` the final norm's output; `pool.hook_pattern` (batch, heads, latents, tokens) an attention
pooling's probabilities; `pool.hook_out` (batch, D) the pooled vector; `head.hook_in` (batch, D) what the classifier
reads. Hierarchical families (Swin) keep their own row layout at the block sites and say so in their adapter.

`hooks(net, {site: function})` calls function(activation) during every forward inside the `with`; a function that
returns a tensor replaces the activation (same shape), one that returns None only reads it. `caching(net, sites)`
keeps activations in a dict (the very tensors the rest of the forward reads, so gradients with respect to them can
be taken); `caching_with_gradients` keeps their gradients too, as a backward reaches them. `unfused_attention(net)`
runs every block's explicit attention path without keeping anything. Hooks are removed on leaving the `with`, in
reverse order, whatever happens.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from vitcli.capture.family import Family, Tap

BLOCK_SITES = (
    "hook_resid_pre",
    "ln1.hook_normalized",
    "ln2.hook_normalized",
    "attn.hook_q",
    "attn.hook_k",
    "attn.hook_v",
    "attn.hook_pattern",
    "attn.hook_z",
    "hook_attn_out",
    "hook_mlp_out",
    "hook_resid_post",
)
MODEL_SITES = ("embed.hook_patches", "ln_final.hook_normalized", "pool.hook_pattern", "pool.hook_out", "head.hook_in")
_BLOCK_SITE = re.compile(r"^blocks\.([0-9]+)\.(.+)$", re.ASCII)

Hook = Callable[[Tensor], Tensor | None]


class SiteError(ValueError):
    """A site name this network does not have, or a replacement at a read-only site."""


def block_site(block: int, kind: str) -> str:
    return f"blocks.{block}.{kind}"


def resid_pre_site(block: int) -> str:
    return block_site(block, "hook_resid_pre")


def head_site(block: int) -> str:
    return block_site(block, "attn.hook_z")


def pattern_site(block: int) -> str:
    return block_site(block, "attn.hook_pattern")


def sublayer_site(block: int, sublayer: str) -> str:
    """sublayer 'attn' or 'mlp'."""
    return block_site(block, f"hook_{sublayer}_out")


def tap(family: Family, site: str) -> Tap:
    """The Tap of a site name on this family, or SiteError naming what the family offers."""
    match = _BLOCK_SITE.match(site)
    if match is None:
        if site not in MODEL_SITES:
            raise SiteError(f"unknown site {site!r}")
        if site not in family.model_sites:
            raise SiteError(f"site {site!r}: {family.name} has no such site")
        return family.model_tap(site)
    number, kind = int(match.group(1)), match.group(2)
    if kind not in BLOCK_SITES:
        raise SiteError(f"unknown site {site!r}")
    if kind not in family.block_sites:
        raise SiteError(f"site {site!r}: {family.name} has no {kind} site")
    blocks = family.blocks()
    if not 1 <= number <= len(blocks):
        raise SiteError(f"site {site!r}: blocks are 1..{len(blocks)}")
    return family.block_tap(blocks[number - 1], family.places()[number - 1], kind)


@contextmanager
def hooks(net: nn.Module | Family, functions: Mapping[str, Hook]) -> Iterator[None]:
    """Run every forward inside the `with` with these functions at their sites (see the module's docstring)."""
    from vitcli.capture.families import family_of

    family = net if isinstance(net, Family) else family_of(net)
    undo: list[Callable[[], None]] = []
    try:
        for site, function in functions.items():
            undo.extend(_register(site, tap(family, site), function))
        yield
    finally:
        for step in reversed(undo):  # last on, first off: a fused flag comes back as it was
            step()


@contextmanager
def caching(net: nn.Module | Family, sites: Sequence[str]) -> Iterator[dict[str, Tensor]]:
    """The activations at `sites` of the last forward inside the `with`, by site name."""
    cache: dict[str, Tensor] = {}

    def keeper(site: str) -> Hook:
        def keep(activation: Tensor) -> Tensor:
            cache[site] = activation
            return activation  # where the site can be replaced, what follows reads the cached tensor (gradients)

        return keep

    with hooks(net, {site: keeper(site) for site in sites}):
        yield cache


@dataclass
class Kept:
    """What caching_with_gradients keeps: the activations of the last forward and, once a backward has reached
    them, their gradients, by site name (both detached)."""

    activations: dict[str, Tensor] = field(default_factory=dict)
    gradients: dict[str, Tensor] = field(default_factory=dict)


@contextmanager
def caching_with_gradients(net: nn.Module | Family, sites: Sequence[str]) -> Iterator[Kept]:
    """The activations at `sites` of the last forward inside the `with` and the gradients a backward sends them.
    Only sites that can be replaced get gradients: elsewhere the forward goes on from the module's own tensor."""
    kept = Kept()

    def keeper(site: str) -> Hook:
        def keep(activation: Tensor) -> Tensor:
            kept.activations[site] = activation.detach()
            if activation.requires_grad:
                activation.register_hook(lambda gradient: kept.gradients.__setitem__(site, gradient.detach()))
            return activation  # what follows reads this tensor, so the gradient reaching it is the site's

        return keep

    with hooks(net, {site: keeper(site) for site in sites}):
        yield kept


@contextmanager
def unfused_attention(net: nn.Module | Family) -> Iterator[None]:
    """Every block on its family's explicit attention path (the one that forms the probabilities) while the `with`
    lasts; restored after, whatever happens. Nothing is kept."""
    from vitcli.capture.families import family_of

    family = net if isinstance(net, Family) else family_of(net)
    depth = len(family.blocks())
    with hooks(family, {pattern_site(number): _read_nothing for number in range(1, depth + 1)}):
        yield


def _read_nothing(_activation: Tensor) -> None:
    return None


def _register(site: str, where: Tap, function: Hook) -> list[Callable[[], None]]:
    """Put `function` on the tap; returns what removes it (and undoes the tap's preparation), in order of doing."""

    def replaced(original: Tensor) -> Tensor | None:
        activation = where.to_site(original)
        value = function(activation)
        if value is None or (value is activation and where.to_module is None):
            return None  # a read (at a read-only site, handing back the activation itself is a read too)
        if where.to_module is None:
            raise SiteError(f"site {site!r} can be read but not replaced on this family")
        return where.to_module(original, value)

    steps = [where.prepare()] if where.prepare is not None else []
    if where.where == "input":

        def pre_hook(_module: nn.Module, inputs: tuple[Any, ...]) -> tuple[Any, ...] | None:
            value = replaced(inputs[0])
            return None if value is None else (value, *inputs[1:])

        handle = where.module.register_forward_pre_hook(pre_hook)
    else:
        index = where.output_index

        def hook(_module: nn.Module, _inputs: Any, output: Any) -> Any:
            value = replaced(output if index is None else output[index])
            if value is None or index is None:
                return value
            return (*output[:index], value, *output[index + 1 :])

        handle = where.module.register_forward_hook(hook)
    return [*steps, handle.remove]
