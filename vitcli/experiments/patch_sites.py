"""Where `vitcli patch` reads and writes activations: sites in timm's pre-norm ViT blocks, as forward hooks that live
only inside a `with` block.

A site is one place of one block (blocks count from one):
- `residual`: the row of token t entering the block (the block's input; CLS is token 0, Pn is token n), or every row;
- `attention`: the attention module's output, every token (before layer scale `ls1` and the residual add);
- `mlp`: the MLP's output, every token (before `ls2`);
- `heads`: head h's slice of the input to `attn.proj` (its A_h V_h, every token), heads counting from one.

`capturing` records every site of every block in one forward (and keeps their gradients when asked); `patching` makes
row k of a batch take site k's value from a stored run, lerp(the running value, stored value, alpha), alpha = 1
meaning the stored value exactly (torch.lerp returns `end` at weight 1).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
from timm.models.vision_transformer import Block, VisionTransformer
from torch import Tensor, nn

from vitcli.errors import UsageError

KINDS = ("residual", "attention", "mlp", "heads")


@dataclass(frozen=True)
class Site:
    kind: str  # one of KINDS
    block: int  # one-based
    index: int | None = None  # residual: the token (None: every token); heads: the head, one-based

    def where(self, head_dim: int) -> tuple[slice | int, slice]:
        """(tokens, features) of this site in its (tokens, width) activation."""
        if self.kind == "residual" and self.index is not None:
            return self.index, slice(None)
        if self.kind == "heads":
            assert self.index is not None
            return slice(None), slice((self.index - 1) * head_dim, self.index * head_dim)
        return slice(None), slice(None)


def missing_parts(net: VisionTransformer) -> str | None:
    """What a (meta or loaded) net lacks for these sites, naming the first block that lacks it; None: nothing."""
    for number, block in enumerate(net.blocks, start=1):
        kind = type(block).__name__
        if not isinstance(getattr(getattr(block, "attn", None), "proj", None), nn.Linear):
            return f"block {number} ({kind}) has no attn.proj Linear"
        if not isinstance(getattr(block, "mlp", None), nn.Module):
            return f"block {number} ({kind}) has no mlp"
        if type(block) is not Block:
            return f"block {number} is a {kind}, not timm's pre-norm Block (norm1, attn, ls1, norm2, mlp, ls2)"
    return None


def require_sites(net: VisionTransformer, name: str) -> None:
    """Refuse (usage error, before weights load when given the meta skeleton) a model without these sites."""
    missing = missing_parts(net)
    if missing is not None:
        raise UsageError(f"cannot patch {name}: {missing}; `vitcli patch` needs timm's standard ViT blocks")


def _module(block: Block, kind: str) -> tuple[nn.Module, bool]:
    """The module whose input (True) or output (False) holds the site's activation."""
    return {
        "residual": (block, True),
        "attention": (block.attn, False),
        "mlp": (block.mlp, False),
        "heads": (block.attn.proj, True),
    }[kind]


def _hook(module: nn.Module, reads_input: bool, change) -> torch.utils.hooks.RemovableHandle:
    """A forward hook applying change(tensor) -> tensor (or None: keep) to the module's first input or its output."""
    if reads_input:

        def before(_module, args):
            changed = change(args[0])
            return None if changed is None else (changed, *args[1:])

        return module.register_forward_pre_hook(before)
    return module.register_forward_hook(lambda _module, _args, output: change(output))


@contextmanager
def capturing(net: VisionTransformer, keep_grad: bool = False) -> Iterator[dict[str, list[Tensor]]]:
    """kind -> per block (in order) the (batch, tokens, width) activation of one forward run inside the block;
    keep_grad: each one retains its gradient (the forward must run with autograd on)."""
    captured: dict[str, list[Tensor]] = {kind: [] for kind in KINDS}
    with ExitStack() as stack:
        for block in net.blocks:
            for kind in KINDS:

                def keep(value: Tensor, kind: str = kind) -> None:
                    if keep_grad:
                        value.retain_grad()
                    captured[kind].append(value)

                stack.callback(_hook(*_module(block, kind), keep).remove)
        yield captured


def stack_captured(captured: dict[str, list[Tensor]], row: int = 0) -> dict[str, Tensor]:
    """kind -> (blocks, tokens, width) for one image of a captured batch (detached)."""
    return {kind: torch.stack([value[row].detach() for value in values]) for kind, values in captured.items()}


@contextmanager
def patching(
    net: VisionTransformer, sites: Sequence[Site], stored: dict[str, Tensor], alpha: float = 1.0
) -> Iterator[None]:
    """Inside the block, row k of a batch gets site k's value moved to `stored`'s: lerp(running, stored, alpha).

    `stored` is kind -> (blocks, tokens, width), e.g. stack_captured() of the clean run.
    """
    head_dim = net.blocks[0].attn.head_dim
    groups: dict[tuple[str, int], list[tuple[int, Site]]] = defaultdict(list)
    for row, site in enumerate(sites):
        groups[(site.kind, site.block)].append((row, site))
    with ExitStack() as stack:
        for (kind, block), entries in groups.items():
            source = stored[kind][block - 1]

            def change(value: Tensor, entries=entries, source=source) -> Tensor:
                value = value.clone()
                for row, site in entries:
                    tokens, features = site.where(head_dim)
                    value[row, tokens, features] = torch.lerp(
                        value[row, tokens, features], source[tokens, features], alpha
                    )
                return value

            stack.callback(_hook(*_module(net.blocks[block - 1], kind), change).remove)
        yield


def logits_from(net: VisionTransformer, start: int, rows: Tensor) -> Tensor:
    """The model's own forward from the rows entering block start + 1 (zero-based `start`) to the logits."""
    return net.forward_head(net.norm(net.blocks[start:](rows)))
