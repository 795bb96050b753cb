"""How a kind of network maps onto vitcli's named sites: the base every family adapter fills in.

A family adapter says, for one kind of network (timm's VisionTransformer, Eva, Beit, SwinTransformer, Hugging Face's
ViT, open_clip's tower), where its blocks are, which module computes each site, how to take the module's tensor to
the site's shape (and back, where the site can be replaced), how its tokens are named and what its forward ends in.
Nothing outside `vitcli.capture` hooks a network: the sites are the only way in.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from torch import Tensor, nn

from vitcli.grid import PatchGrid


@dataclass(frozen=True)
class BlockPlace:
    """Where one block sits: its one-based number over all stages, its stage, the token grid it attends over."""

    number: int
    stage: int
    grid: PatchGrid
    heads: int
    head_dim: int


def _same(tensor: Tensor) -> Tensor:
    return tensor


def _back(_original: Tensor, site: Tensor) -> Tensor:
    return site


@dataclass
class Tap:
    """One site on one module: the module's first input (`where="input"`) or its output (`"output"`, element
    `output_index` of a tuple output) taken to the site's shape by `to_site`. `to_module(original, site)` makes the
    module's tensor from a replaced site value; None marks a read-only site. `prepare()` runs before the hook goes on
    and returns the function that undoes it (timm's fused attention is switched off while its pattern is hooked)."""

    module: nn.Module
    where: Literal["input", "output"]
    to_site: Callable[[Tensor], Tensor] = _same
    to_module: Callable[[Tensor, Tensor], Tensor] | None = _back
    output_index: int | None = None
    prepare: Callable[[], Callable[[], None]] | None = None


# What a family can offer; each command names what it needs of them (docs/models.md's table is built from both).
FEATURES = {
    "pattern": "the attention probabilities of every block, on one token grid per block",
    "heads": "each head's output entering a linear output projection (per-head decompositions)",
    "replace": "sites that can be replaced (ablation, patching)",
    "plain_rows": "one row per token through every block on one grid (no windows, no patch merging)",
    "explicit_forward": "a forward vitcli writes out by hand and checks against the module's own",
    "linear_patches": "patches embedded by one linear map of their pixels",
    "class_head": "a classifier head",
    "linear_head": "a classifier head that is one Linear layer of the pooled embedding (not a zero-shot head)",
    "cls_token": "a class token (CLS) at row 0",
    "positions": "learned absolute position embeddings added to the patch rows",
    "plain_pooling": "a head that reads the CLS row or the mean of the final rows (no attention pooling)",
    "pooling_readout": "a pooling attribution writes as a linear map: the CLS row, the mean, or attention pooling with "
    "its probabilities frozen",
    "attention_pooling": "an attention pooling (timm's AttentionPoolLatent) whose probabilities can be captured",
    "pattern_gradients": "attention probabilities the forward itself goes on with, so gradients reach them",
    "timm_blocks": "timm's standard Block, Attention and Mlp: compare-patch-size counts them in closed form and "
    "rebuilds the model at other patch sizes",
    "text_tower": "a text tower paired with the image tower (open_clip's CLIP and SigLIP): zero-shot labels, text "
    "targets",
}


class Family(ABC):
    """One kind of network, wrapped around one instance (loaded, or a meta-device skeleton for usage checks)."""

    name: ClassVar[str]  # how docs/models.md and refusals name the family
    # The block sites this family can offer (a subset of capture.sites.BLOCK_SITES) and its model sites.
    block_sites: ClassVar[frozenset[str]]
    model_sites: ClassVar[frozenset[str]] = frozenset()
    # Whether attn.hook_pattern is a tensor the forward itself goes on with (so gradients reach it), not one computed
    # beside the module from its input (open_clip's nn.MultiheadAttention).
    pattern_in_forward: ClassVar[bool] = True

    def __init__(self, net: nn.Module):
        self.net = net

    @property
    @abstractmethod
    def features(self) -> frozenset[str]:
        """The FEATURES this instance has."""

    def refusal(self) -> str | None:
        """Why this instance cannot be taken apart at its sites (one clause naming what it has), or None."""
        return None

    # ----- architecture

    @abstractmethod
    def blocks(self) -> list[nn.Module]:
        """Every block, in forward order, over all stages."""

    @abstractmethod
    def places(self) -> list[BlockPlace]:
        """One BlockPlace per block of blocks()."""

    @abstractmethod
    def grid(self) -> PatchGrid:
        """The input's patch grid with the prefix token names (CLS, DIST, R1..Rn) the first block sees."""

    @property
    @abstractmethod
    def width(self) -> int:
        """The width of the rows entering block 1."""

    @property
    @abstractmethod
    def num_classes(self) -> int:
        """0 when the forward ends in a pooled embedding rather than a classifier's logits."""

    @property
    @abstractmethod
    def pooling(self) -> str:
        """How the final rows become one vector: "token" (CLS), "avg", "map" (attention pooling), ..."""

    # ----- the model's own forwards

    def forward(self, inputs: Tensor) -> Tensor:
        """The model's own output for (B, 3, H, W) normalized inputs: logits, or the pooled embedding."""
        return self.net(inputs)

    def embed(self, inputs: Tensor) -> Tensor:
        """Block 1's input rows (B, N, width) for (B, 3, H, W) normalized inputs, by the model's own layers (the
        value of blocks.1.hook_resid_pre, without running the blocks)."""
        raise NotImplementedError(f"{self.name} does not embed its inputs alone")

    @abstractmethod
    def pooled(self, inputs: Tensor) -> Tensor:
        """The pooled embedding (B, D'): what a classifier head would read (timm's pre_logits)."""

    @abstractmethod
    def run_from(self, number: int, rows: Tensor) -> Tensor:
        """The model's own forward on from `rows` entering block `number` (one-based): its output (logits or
        pooled embedding)."""

    # ----- sites

    @abstractmethod
    def block_tap(self, block: nn.Module, place: BlockPlace, kind: str) -> Tap:
        """The Tap of block site `kind` (a key of capture.sites.BLOCK_SITES) of one block."""

    def model_tap(self, kind: str) -> Tap:
        """The Tap of model site `kind` (a key of capture.sites.MODEL_SITES)."""
        raise KeyError(kind)

    # ----- the attention module around its pattern (the self-check every attention view prints)

    def attention_from_heads(self, number: int, heads: Tensor) -> Tensor:
        """Block `number`'s attention-module output made from its heads' outputs (batch, tokens, heads, d), the
        value of attn.hook_z: what the module does after the pattern has mixed the values."""
        raise NotImplementedError(f"{self.name} does not write out its attention output")

    def explicit_attention(self, number: int, normed: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Block `number`'s attention written out on the rows it reads (the "explicit_forward" feature): q, k, v
        (batch, heads, tokens, d), the pattern (batch, heads, tokens, tokens) and the module's output, without calling
        the attention module itself."""
        raise NotImplementedError(f"{self.name} has no explicit forward")

    def own_attention(self, number: int, normed: Tensor) -> Tensor:
        """Block `number`'s attention module called on the rows it reads (ln1.hook_normalized), on its own (fused)
        path."""
        raise NotImplementedError(f"{self.name} does not call its attention modules alone")

    def describe(self) -> dict[str, Any]:
        """Facts for docs/models.md and the JSON: the family, grid, prefix tokens, pooling, classes."""
        grid = self.grid()
        return {
            "family": self.name,
            "grid": f"{grid.rows}x{grid.cols}",
            "prefix_tokens": list(grid.prefix_names),
            "pooling": self.pooling,
            "classes": self.num_classes,
        }
