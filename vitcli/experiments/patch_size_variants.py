"""What patch size does to a ViT's shape: tokens, attention scores and compute, counted in closed form and by torch.

Every variant is the same architecture (width, depth, heads, MLP) built at another patch size; only the patch
embedding (3 p^2 x D + D parameters) and the position embeddings (one per grid cell) change shape.

Compute is counted in multiply-accumulates (MACs) per image. The closed form counts the matrix products:
  patch embedding  n * 3p^2 * D            (n patches; the same 3 * H * W * D for every p that divides the image)
  per block        N * D * 3A  (qkv)  +  heads * N^2 * head_dim  (q k^T)  +  heads * N^2 * head_dim  (attention @ v)
                   + N * A * D  (proj)  +  2 * N * D * M  (MLP)    (N = n + prefix tokens, A = heads * head_dim)
  head             D * classes
FlopCounterMode counts FLOPs = 2 x MACs of matmuls and convolutions only; softmax, layer norm, GELU, the residual
adds, the attention scale and the bias adds are in neither count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import timm
import torch
import torch.nn.functional as F
from timm.layers import Attention, Mlp
from timm.models.vision_transformer import Block, VisionTransformer
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from vitcli.capture import unfused_attention
from vitcli.errors import UsageError, VitcliError
from vitcli.loading import require_vit

# ----- the architecture and its closed-form counts


@dataclass(frozen=True)
class Dimensions:
    """The dimensions of a timm ViT that the counts depend on, read from a skeleton built on the meta device."""

    name: str
    native_patch: int
    native_image: int
    in_chans: int
    embed_dim: int
    depth: int
    num_heads: int
    head_dim: int
    mlp_hidden: int
    num_prefix: int
    position_rows: int  # prefix rows that carry a learned position embedding; -1: no absolute position embedding
    head_outputs: int  # classes, summed over classifier heads (two for distilled models), 0 for none

    @property
    def attn_dim(self) -> int:
        return self.num_heads * self.head_dim


def read_dimensions(name: str) -> Dimensions:
    """Validate the model name and read its dimensions without building weights."""
    net = require_vit(name)
    require_countable(net, name)
    attention = net.blocks[0].attn
    patch_height, patch_width = net.patch_embed.patch_size
    image_height, image_width = net.patch_embed.img_size
    if patch_height != patch_width or image_height != image_width:
        raise UsageError(
            f"{name} has {patch_height}x{patch_width} patches on a {image_height}x{image_width} image; "
            "compare-patch-size handles square patches and images"
        )
    return Dimensions(
        name=name,
        native_patch=patch_height,
        native_image=image_height,
        in_chans=net.patch_embed.proj.in_channels,
        embed_dim=net.embed_dim,
        depth=len(net.blocks),
        num_heads=attention.num_heads,
        head_dim=attention.head_dim,
        mlp_hidden=net.blocks[0].mlp.fc1.out_features,
        num_prefix=net.num_prefix_tokens,
        position_rows=-1 if net.pos_embed is None else 0 if net.no_embed_class else net.num_prefix_tokens,
        head_outputs=sum(head.out_features for head in classifier_heads(net)),
    )


def require_countable(net: VisionTransformer, name: str) -> None:
    """The closed form assumes timm's standard Block, Attention and Mlp and a class-token or average-pooled head."""
    for index, block in enumerate(net.blocks):
        if type(block) is not Block or type(block.attn) is not Attention or type(block.mlp) is not Mlp:
            raise UsageError(
                f"cannot count {name}: block {index + 1} is a {type(block).__name__} with {type(block.attn).__name__} "
                f"and {type(block.mlp).__name__}; compare-patch-size counts timm's standard Block, Attention and Mlp"
            )
    if net.global_pool not in ("token", "avg"):
        raise UsageError(
            f"cannot count {name}: its head pools with {net.global_pool!r}; "
            "compare-patch-size counts 'token' and 'avg' pooling"
        )


def classifier_heads(net: VisionTransformer) -> list[nn.Linear]:
    return [head for head in (net.head, getattr(net, "head_dist", None)) if isinstance(head, nn.Linear)]


@dataclass(frozen=True)
class MacCount:
    """Multiply-accumulates per image, split by how they grow with the number of tokens."""

    attention: int  # q k^T and weights @ v: grows with N^2
    rest: int  # patch embedding, qkv, proj, MLP, head: grows with N (the patch embedding not at all)

    @property
    def total(self) -> int:
        return self.attention + self.rest


@dataclass(frozen=True)
class Variant:
    """One patch size applied to an image size: its grid and everything counted from it in closed form."""

    dimensions: Dimensions
    patch_size: int
    image_size: int

    @property
    def padded_size(self) -> int:
        """The image side after padding to a multiple of the patch size (the image size when p divides it)."""
        return math.ceil(self.image_size / self.patch_size) * self.patch_size

    @property
    def padding(self) -> int:
        return self.padded_size - self.image_size

    @property
    def grid_side(self) -> int:
        return self.padded_size // self.patch_size

    @property
    def patch_tokens(self) -> int:
        return self.grid_side**2

    @property
    def tokens(self) -> int:
        return self.patch_tokens + self.dimensions.num_prefix

    @property
    def values_per_patch(self) -> int:
        return self.dimensions.in_chans * self.patch_size**2

    @property
    def patch_embedding_parameters(self) -> int:
        return self.values_per_patch * self.dimensions.embed_dim + self.dimensions.embed_dim

    @property
    def position_embedding_parameters(self) -> int:
        rows = self.dimensions.position_rows
        return 0 if rows < 0 else (self.patch_tokens + rows) * self.dimensions.embed_dim

    @property
    def scores_per_head_block(self) -> int:
        return self.tokens**2

    @property
    def patch_scores_per_head_block(self) -> int:
        return self.patch_tokens**2

    @property
    def scores_whole_model(self) -> int:
        return self.scores_per_head_block * self.dimensions.num_heads * self.dimensions.depth

    @property
    def patch_scores_whole_model(self) -> int:
        return self.patch_scores_per_head_block * self.dimensions.num_heads * self.dimensions.depth

    def macs(self) -> MacCount:
        arch, tokens = self.dimensions, self.tokens
        embed, attn_dim = arch.embed_dim, arch.attn_dim
        per_block_attention = 2 * arch.num_heads * tokens**2 * arch.head_dim
        per_block_rest = (
            tokens * embed * 3 * attn_dim + tokens * attn_dim * embed + 2 * tokens * embed * arch.mlp_hidden
        )
        patch_embedding = self.patch_tokens * self.values_per_patch * embed
        head = embed * arch.head_outputs
        return MacCount(arch.depth * per_block_attention, patch_embedding + arch.depth * per_block_rest + head)


def parse_patch_sizes(text: str) -> list[int]:
    """'8,16,32' -> [8, 16, 32]; bad items are usage errors."""
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise UsageError("--patch-sizes is empty: give one or more patch sizes in pixels, e.g. --patch-sizes 8,16,32")
    sizes = []
    for item in items:
        try:
            sizes.append(int(item))
        except ValueError:
            raise UsageError(
                f"--patch-sizes: {item!r} is not a whole number of pixels (e.g. --patch-sizes 8,16,32)"
            ) from None
    return sizes


def plan_variants(dimensions: Dimensions, patch_sizes: list[int], image_size: int, pad: bool) -> list[Variant]:
    """The variants to compare, smallest patch first, always including the checkpoint's own patch size."""
    if image_size < 1:
        raise UsageError(f"--image-size must be at least 1 pixel, not {image_size}")
    for patch in patch_sizes:
        if not 1 <= patch <= image_size:
            raise UsageError(f"patch size must be between 1 and {image_size} (the image size), not {patch}")
        if image_size % patch and not pad:
            divisors = [size for size in range(1, image_size + 1) if image_size % size == 0]
            raise UsageError(
                f"patch size {patch} does not divide the {image_size}-pixel image ({image_size} / {patch} = "
                f"{image_size / patch:.2f}); use a divisor of {image_size} ({', '.join(map(str, divisors))}) "
                "or --pad to zero-pad the image to a multiple of the patch size as timm's dynamic_img_pad does"
            )
    if image_size % dimensions.native_patch and not pad:
        raise UsageError(
            f"the checkpoint's own patch size {dimensions.native_patch}, which every ratio is taken against, does not "
            f"divide the {image_size}-pixel image; choose an --image-size that is a multiple of it or pass --pad"
        )
    chosen = sorted(set(patch_sizes) | {dimensions.native_patch})
    return [Variant(dimensions, patch, image_size) for patch in chosen]


# ----- building variants and counting them with torch


def build_variant(variant: Variant, device: torch.device | str) -> VisionTransformer:
    """The architecture at this patch size, built for the padded image size; weights initialised by timm."""
    return timm.create_model(
        variant.dimensions.name,
        pretrained=False,
        patch_size=variant.patch_size,
        img_size=variant.padded_size,
        device=device,
    ).eval()


def pad_to_patches(inputs: Tensor, patch_size: int) -> Tensor:
    """Zero-pad (B, C, H, W) on the right and bottom to multiples of patch_size: timm's dynamic_img_pad."""
    height, width = inputs.shape[-2:]
    return F.pad(inputs, (0, -width % patch_size, 0, -height % patch_size))


def count_variant(variant: Variant) -> tuple[MacCount, int]:
    """FlopCounterMode's count of one forward on the meta device, halved (bmm is the attention, everything else
    the rest), and the variant's parameter count."""
    net = build_variant(variant, "meta")
    size = variant.image_size
    inputs = pad_to_patches(torch.zeros(1, variant.dimensions.in_chans, size, size, device="meta"), variant.patch_size)
    # The explicit q k^T and weights @ v are counted on every backend; fused kernels are not always.
    with unfused_attention(net), FlopCounterMode(display=False) as counter, torch.inference_mode():
        net(inputs)
    flops = {str(operator): count for operator, count in counter.get_flop_counts()["Global"].items()}
    attention = flops.pop("aten.bmm", 0)
    if any(count % 2 for count in (attention, *flops.values())):
        raise VitcliError(f"FlopCounterMode reported an odd FLOP count for patch {variant.patch_size}: {flops}")
    return MacCount(attention // 2, sum(flops.values()) // 2), sum(parameter.numel() for parameter in net.parameters())
