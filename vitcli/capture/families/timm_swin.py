"""timm's SwinTransformer: four stages of shifted-window blocks with patch merging between them.

Each stage has its own token grid (56x56, 28x28, 14x14, 7x7 for a 224 input with 4-pixel patches) and no prefix
token. `blocks()` flattens the stages, so block B counts over all of them; `places()` gives each block its stage and
its stage's grid, whose patch size is the input pixels per token at that stage (4, 8, 16, 32).

Swin's blocks keep (batch, H, W, C) rows and attend within 7x7 windows of the grid cyclically shifted by
`shift_size` (odd blocks). The block sites give rows as (batch, H*W, C), row by row like P1..PN. Sites inside the
attention (q, k, v, z) are taken from window order back to grid order by one permutation of the tokens, so they can
be replaced too; q and k are the qkv Linear's rows before timm's scale, and the scores add the relative position
bias (and, in a shifted block, the mask) to q k^T * scale, so the pattern is not softmax(q k^T * scale) alone.

`attn.hook_pattern` is each window's (heads, 49, 49) probabilities put onto the stage grid: token i's row holds its
window's probabilities at the grid positions of that window's tokens and 0 elsewhere (rows sum to 1; in a shifted
block, the tokens of a wrapped-around window that timm masks with -100 keep their tiny e^-100 share). It is
read-only: a replacement could put weight outside a window, which the module cannot compute.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from vitcli.capture.families.timm_vit import TimmFamily, unfused
from vitcli.capture.family import BlockPlace, Tap
from vitcli.grid import PatchGrid


def window_order(rows: int, cols: int, window: tuple[int, int], shift: tuple[int, int]) -> Tensor:
    """The grid token (row-major index) at each position of timm's window order: window by window (row-major over
    windows), then row-major inside a window, after rolling the grid by -shift (timm's torch.roll)."""
    grid = torch.arange(rows * cols).reshape(rows, cols)
    shifted = torch.roll(grid, shifts=(-shift[0], -shift[1]), dims=(0, 1))
    windows = shifted.reshape(rows // window[0], window[0], cols // window[1], window[1]).permute(0, 2, 1, 3)
    return windows.reshape(-1)


class WindowLayout:
    """How one block's windows lie on its stage grid: tensors in timm's window order (batch x windows, window area,
    ...) to grid order (batch, H*W, ...) and back."""

    def __init__(self, block: nn.Module):
        rows, cols = block.input_resolution
        self.window_area = block.window_size[0] * block.window_size[1]
        self.order = window_order(rows, cols, tuple(block.window_size), tuple(block.shift_size))
        self.inverse = torch.argsort(self.order)

    def to_grid(self, windows: Tensor) -> Tensor:
        """(batch x windows, area, ...) -> (batch, H*W, ...)."""
        tokens = windows.reshape(-1, self.order.numel(), *windows.shape[2:])
        return tokens[:, self.inverse.to(windows.device)]

    def to_windows(self, tokens: Tensor) -> Tensor:
        """(batch, H*W, ...) -> (batch x windows, area, ...)."""
        ordered = tokens[:, self.order.to(tokens.device)]
        return ordered.reshape(-1, self.window_area, *tokens.shape[2:])

    def pattern(self, windowed: Tensor) -> Tensor:
        """(batch x windows, heads, area, area) probabilities -> (batch, heads, H*W, H*W) on the grid, 0 outside each
        token's window."""
        tokens, area = self.order.numel(), self.window_area
        per_image = windowed.reshape(-1, tokens // area, windowed.shape[1], area, area).transpose(1, 2)
        order = self.order.to(windowed.device).reshape(-1, area)  # (windows, area): grid token of each position
        full = windowed.new_zeros(per_image.shape[0], per_image.shape[1], tokens, tokens)
        full[:, :, order[:, :, None], order[:, None, :]] = per_image
        return full


def _rows(tensor: Tensor) -> Tensor:
    """(batch, H, W, C) -> (batch, H*W, C), row by row."""
    return tensor.flatten(1, 2)


def _rows_back(original: Tensor, site: Tensor) -> Tensor:
    return site.reshape(original.shape)


def grid_rows(module: nn.Module, where: str) -> Tap:
    """A (batch, H, W, C) input or output as (batch, H*W, C) rows, replaceable."""
    return Tap(module, where, _rows, _rows_back)  # type: ignore[arg-type]


def qkv_part(qkv: nn.Module, layout: WindowLayout, part: int, heads: int) -> Tap:
    """q (0), k (1) or v (2) from WindowAttention's fused qkv Linear, (batch, H*W, heads, d) in grid order."""

    def to_site(output: Tensor) -> Tensor:
        return layout.to_grid(output.unflatten(-1, (3, heads, -1))[..., part, :, :])

    def to_module(original: Tensor, site: Tensor) -> Tensor:
        parts = list(original.unflatten(-1, (3, heads, -1)).unbind(-3))
        parts[part] = layout.to_windows(site)
        return torch.stack(parts, dim=-3).flatten(-3)

    return Tap(qkv, "output", to_site, to_module)


class TimmSwin(TimmFamily):
    name = "timm SwinTransformer"
    model_sites = frozenset(("embed.hook_patches", "ln_final.hook_normalized", "pool.hook_out", "head.hook_in"))

    def refusal(self) -> str | None:
        for place, block in zip(self.places(), self.blocks(), strict=True):
            rows, cols = block.input_resolution
            if rows % block.window_size[0] or cols % block.window_size[1]:
                return (
                    f"block {place.number}'s {rows}x{cols} grid is not tiled by its "
                    f"{block.window_size[0]}x{block.window_size[1]} windows (timm pads it)"
                )
        return None

    @property
    def features(self) -> frozenset[str]:
        # No "plain_rows" (windows, patch merging) and no explicit forward; pattern and heads are exact per block.
        features = {"linear_patches"}
        if self.refusal() is None:
            features |= {"pattern", "heads", "replace"}
        if self.net.num_classes:
            features.add("class_head")
        return frozenset(features)

    def blocks(self) -> list[nn.Module]:
        return [block for stage in self.net.layers for block in stage.blocks]

    def stages(self) -> list[tuple[int, nn.Module]]:
        """(one-based stage, block) for every block in forward order."""
        return [(number, block) for number, stage in enumerate(self.net.layers, start=1) for block in stage.blocks]

    def places(self) -> list[BlockPlace]:
        height, width = self._input_size()
        places = []
        for number, (stage, block) in enumerate(self.stages(), start=1):
            rows, _cols = block.input_resolution
            grid = PatchGrid(height, width, height // rows, ())  # pixels per token at this stage
            attention = block.attn
            heads = attention.num_heads
            head_dim = attention.qkv.out_features // 3 // heads
            places.append(BlockPlace(number, stage, grid, heads, head_dim))
        return places

    def _input_size(self) -> tuple[int, int]:
        return tuple(self.net.patch_embed.img_size)

    def grid(self) -> PatchGrid:
        height, width = self._input_size()
        return PatchGrid(height, width, self.net.patch_embed.patch_size[0], ())

    def last_grid(self) -> PatchGrid:
        """The last stage's grid: what the final norm, Grad-CAM and the pooling see."""
        return self.places()[-1].grid

    @property
    def pooling(self) -> str:
        return self.net.global_pool

    def run_from(self, number: int, rows: Tensor) -> Tensor:
        net = self.net
        stage, block = self.stages()[number - 1]
        first = next(index for index, (other, _) in enumerate(self.stages()) if other == stage)
        x = rows.reshape(rows.shape[0], *block.input_resolution, rows.shape[-1])
        x = net.layers[stage - 1].blocks[number - 1 - first :](x)
        x = net.layers[stage:](x)
        return net.forward_head(net.norm(x))

    def block_tap(self, block: nn.Module, place: BlockPlace, kind: str) -> Tap:
        attention = block.attn
        heads = place.heads

        def layout() -> WindowLayout:
            return WindowLayout(block)

        taps: dict[str, Callable[[], Tap]] = {
            "hook_resid_pre": lambda: grid_rows(block, "input"),
            "ln1.hook_normalized": lambda: grid_rows(block.norm1, "output"),
            # norm2 reads the rows already flattened in grid order: pytorch-grad-cam's Swin layer.
            "ln2.hook_normalized": lambda: Tap(block.norm2, "output"),
            "attn.hook_q": lambda: qkv_part(attention.qkv, layout(), 0, heads),
            "attn.hook_k": lambda: qkv_part(attention.qkv, layout(), 1, heads),
            "attn.hook_v": lambda: qkv_part(attention.qkv, layout(), 2, heads),
            "attn.hook_pattern": lambda: Tap(
                attention.attn_drop, "output", layout().pattern, None, prepare=unfused(attention)
            ),
            "attn.hook_z": lambda: _heads_in_grid(attention.proj, layout(), heads),
            # drop_path1 sees the window-merged, unshifted (batch, H, W, C) output; drop_path2 already (batch, N, C).
            "hook_attn_out": lambda: grid_rows(block.drop_path1, "output"),
            "hook_mlp_out": lambda: Tap(block.drop_path2, "output"),
            "hook_resid_post": lambda: grid_rows(block, "output"),
        }
        return taps[kind]()

    def model_tap(self, kind: str) -> Tap:
        net = self.net
        return {
            "embed.hook_patches": lambda: grid_rows(net.patch_embed, "output"),
            "ln_final.hook_normalized": lambda: grid_rows(net.norm, "output"),
            "pool.hook_out": lambda: Tap(net.head.global_pool, "output"),
            "head.hook_in": lambda: Tap(net.head.fc, "input"),
        }[kind]()

    def describe(self) -> dict[str, object]:
        facts = super().describe()
        stages: dict[int, str] = {}
        for place in self.places():
            stages.setdefault(place.stage, f"{place.grid.rows}x{place.grid.cols}")
        facts["stages"] = list(stages.values())
        return facts


def _heads_in_grid(proj: nn.Module, layout: WindowLayout, heads: int) -> Tap:
    """The output projection's input split by head, in grid order: attn.hook_z, (batch, H*W, heads, d)."""

    def to_site(windows: Tensor) -> Tensor:
        return layout.to_grid(windows.unflatten(-1, (heads, -1)))

    def to_module(_original: Tensor, site: Tensor) -> Tensor:
        return layout.to_windows(site).flatten(-2)

    return Tap(proj, "input", to_site, to_module)
