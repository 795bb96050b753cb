"""What a command checks its options against before any weights load: a model's blocks, heads, grid, classes and
what its family offers, read from a family adapter's net (a meta skeleton or a loaded model)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vitcli.capture import BlockPlace, Family
from vitcli.capture.support import family_features
from vitcli.grid import PatchGrid


@dataclass(frozen=True)
class Architecture:
    """What a command checks its arguments against before any weights load."""

    name: str
    depth: int
    num_heads: int
    embed_dim: int
    grid: PatchGrid
    num_classes: int  # 0: no classifier head (the model outputs pooled features)
    labels: tuple[str, ...]  # one name per class
    global_pool: str  # timm's pooling of the final tokens: "token" (CLS), "avg", "map", ...
    mlp_hidden: int = 0  # the width of a block's MLP hidden layer (fc1's outputs)
    family: str = "timm VisionTransformer"  # the family adapter's name (capture.family.Family.name)
    features: frozenset[str] = frozenset()  # what the family offers (capture.family.FEATURES), for the needs check
    family_refusal: str | None = None  # why its blocks cannot be taken apart at their sites, if they cannot

    places: tuple[BlockPlace, ...] = ()  # every block's stage, grid and heads (Swin's stages differ)

    def place(self, block: int) -> BlockPlace:
        """The place of one-based block `block`."""
        return self.places[block - 1]

    @property
    def staged(self) -> bool:
        """Whether the blocks attend over grids of their stage (Swin) rather than one grid."""
        return len({place.grid for place in self.places}) > 1

    @property
    def map_grid(self) -> PatchGrid:
        """VitModel.map_grid before the weights load: the input's grid, or the last stage's."""
        return self.places[-1].grid if self.staged else self.grid

    embedding_width: int = 0  # the pooled embedding's width (what a head reads; embedding targets score it)

    @property
    def longest_vector(self) -> int:
        """The most values any one vector of the forward has: a patch's pixels, a row, the MLP's hidden layer, or
        the logits. Options that show leading values are bounded by it."""
        return max(3 * self.grid.patch_size**2, self.embed_dim, self.mlp_hidden, self.num_classes)


def architecture_from(name: str, family: Family, num_classes: int, labels: tuple[str, ...]) -> Architecture:
    """The facts of a family adapter's net (a skeleton or a loaded model) whose head has `num_classes` classes (a
    checkpoint's head may have another number than the architecture's own, or none)."""
    # A zero-shot head (vitcli.zero_shot) is a classifier head, but not one Linear layer.
    linear = num_classes and not getattr(getattr(family.net, "head", None), "reads_texts", False)
    features = family_features(family) - {"class_head", "linear_head"}
    features |= ({"class_head"} if num_classes else set()) | ({"linear_head"} if linear else set())
    return Architecture(
        name=name,
        depth=len(family.blocks()),
        num_heads=heads_of(family),
        embed_dim=family.width,
        grid=family.grid(),
        num_classes=num_classes,
        labels=labels,
        global_pool=family.pooling,
        mlp_hidden=mlp_hidden_width(family),
        family=family.name,
        features=frozenset(features),
        family_refusal=family.refusal(),
        # A family's places need its standard blocks; a refused family still names its depth and heads.
        places=tuple(family.places()) if family.refusal() is None else (),
        embedding_width=embedding_width(family.net),
    )


def mlp_hidden_width(family: Family) -> int:
    fc1 = getattr(getattr(family.blocks()[0], "mlp", None), "fc1", None)
    return int(getattr(fc1, "out_features", 4 * family.width))


def heads_of(family: Family) -> int:
    """Block 1's heads: from the family's places, or of a refused family (whose blocks have no places) from the first
    module of block 1 that names them."""
    if family.refusal() is None:
        return family.places()[0].heads
    return next((module.num_heads for module in family.blocks()[0].modules() if hasattr(module, "num_heads")), 0)


def embedding_width(net: torch.nn.Module) -> int:
    """The width of the pooled embedding a classifier head reads (timm's pre-logits features)."""
    return getattr(net, "head_hidden_size", None) or net.num_features
