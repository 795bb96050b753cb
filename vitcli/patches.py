"""How an image becomes patch rows: the grid, channel-major flattening, the shared projection W_E and the position sum."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from rich.console import Group
from rich.table import Table

from vitcli.grid import PatchGrid
from vitcli.images import ImageSource
from vitcli.model import PreparedImage, VitModel
from vitcli.render import weights_caption


@dataclass
class PatchDetail:
    """One patch followed from pixels to the row that enters block 1 (all vectors full length)."""

    patch: int
    facts: dict[str, int | str]
    pixels: list[float]  # 3 p^2 normalized values, channel-major
    projection: list[float]  # pixels @ W_E + b_E
    position: list[float]  # the learned position embedding added to this token
    block_input: list[float]  # the row entering block 1


@dataclass
class PatchesResult:
    source: ImageSource
    grid: PatchGrid
    embed_dim: int
    weights: str
    projection_max_difference: float  # max |X W_E + b_E - Conv2d(x)| over all patches and features
    projections: list[list[float]]  # (patches, D)
    selected: list[PatchDetail]
    shown_values: int  # how many leading values tables and CSV rows show

    @property
    def values_per_patch(self) -> int:
        return 3 * self.grid.patch_size**2

    def summary(self) -> dict[str, Any]:
        grid = self.grid
        return {
            "image_height": grid.image_height,
            "image_width": grid.image_width,
            "patch_size": grid.patch_size,
            "grid_rows": grid.rows,
            "grid_cols": grid.cols,
            "patches": grid.num_patches,
            "prefix_tokens": list(grid.prefix_names),
            "rows_with_prefix": grid.num_tokens,
            "values_per_patch": self.values_per_patch,
            "embed_dim": self.embed_dim,
            "flattening": "channel-major: R rows, then G, then B; index c*p*p + row*p + col",
            "projection_max_abs_difference_vs_conv2d": self.projection_max_difference,
        }

    def table(self) -> Group:
        grid = self.grid
        facts = Table(title=f"{self.source.path.name}: patches", caption=weights_caption(self.weights), show_header=False)
        facts.add_column("fact")
        facts.add_column("value", justify="right")
        facts.add_row("model input", f"{grid.image_height}x{grid.image_width} crop")
        facts.add_row("patch size", f"{grid.patch_size}x{grid.patch_size}")
        facts.add_row("grid", f"{grid.rows} rows x {grid.cols} cols")
        facts.add_row("patches", f"P1..P{grid.num_patches}")
        facts.add_row("rows with " + "+".join(grid.prefix_names), str(grid.num_tokens))
        facts.add_row("values per patch", f"{self.values_per_patch} (3x{grid.patch_size}x{grid.patch_size}, R then G then B)")
        facts.add_row("projection", f"{self.values_per_patch} -> {self.embed_dim} (one shared W_E, b_E)")
        facts.add_row("max |X W_E + b_E - Conv2d|", f"{self.projection_max_difference:.3g}")
        parts: list[Any] = [facts]
        if grid.rows <= 24:
            parts.append(self._numbering_table())
        for detail in self.selected:
            parts.append(self._detail_table(detail))
        return Group(*parts)

    def _numbering_table(self) -> Table:
        grid = self.grid
        table = Table(title="patch numbers (row, col zero-based)", padding=(0, 0))
        table.add_column("", justify="right", style="dim")
        for col in range(grid.cols):
            table.add_column(f"c{col}", justify="right")
        for row in range(grid.rows):
            table.add_row(f"r{row}", *(str(grid.patch_at(row, col)) for col in range(grid.cols)))
        return table

    def _detail_table(self, detail: PatchDetail) -> Table:
        facts = detail.facts
        shown = self.shown_values
        table = Table(
            title=(
                f"{facts['patch']} = token {facts['token']}: row {facts['row']}, col {facts['col']} zero-based "
                f"(row {facts['row_1based']}, col {facts['col_1based']} from one); "
                f"pixels x {facts['left']}..{facts['right'] - 1}, y {facts['top']}..{facts['bottom'] - 1}"
            )
        )
        table.add_column("vector")
        table.add_column("length", justify="right")
        table.add_column(f"first {shown} values")
        for name, values in (
            ("normalized pixels (R first)", detail.pixels),
            ("projection X W_E + b_E", detail.projection),
            ("position embedding", detail.position),
            ("sum entering block 1", detail.block_input),
        ):
            table.add_row(name, str(len(values)), " ".join(f"{value:+.4f}" for value in values[:shown]))
        return table

    def rows(self) -> list[dict[str, Any]]:
        rows = []
        for patch in range(1, self.grid.num_patches + 1):
            row: dict[str, Any] = {"image": str(self.source.path), **self.grid.describe_patch(patch)}
            row.update({f"proj_{index}": value for index, value in enumerate(self.projections[patch - 1][: self.shown_values])})
            row["weights"] = self.weights
            rows.append(row)
        return rows

    def to_json(self) -> dict[str, Any]:
        return {
            "image": self.source.to_json(),
            "weights": self.weights,
            "grid": self.summary(),
            "selected": [
                {
                    **detail.facts,
                    "pixels": detail.pixels,
                    "projection": detail.projection,
                    "position_embedding": detail.position,
                    "block1_input": detail.block_input,
                }
                for detail in self.selected
            ],
        }


def inspect_patches(model: VitModel, image: PreparedImage, selected: list[int], shown_values: int) -> PatchesResult:
    """Flatten, project and position every patch of one image, and check the projection against the Conv2d."""
    grid = model.grid
    trace = model.trace(image.input.unsqueeze(0), blocks=[])
    net = model.net
    with torch.inference_mode():
        conv = net.patch_embed.proj(image.input.unsqueeze(0).to(model.device)).flatten(2).transpose(1, 2).cpu()
    difference = float((trace.patch_embeddings - conv).abs().max())
    position_table = net.pos_embed[0].detach().cpu()
    details = []
    for patch in selected:
        token = grid.token_of_patch(patch)
        # Position embeddings cover the prefix tokens too unless the model adds them to patches only.
        position_index = patch - 1 if net.no_embed_class else token
        details.append(
            PatchDetail(
                patch,
                grid.describe_patch(patch),
                trace.patch_pixels[0, patch - 1].tolist(),
                trace.patch_embeddings[0, patch - 1].tolist(),
                position_table[position_index].tolist(),
                trace.tokens[0, token].tolist(),
            )
        )
    return PatchesResult(
        image.source,
        grid,
        model.embed_dim,
        model.spec.label,
        difference,
        trace.patch_embeddings[0].tolist(),
        details,
        shown_values,
    )


def patch_figure(result: PatchesResult, crop) -> Any:
    """The crop with the patch grid and every patch number; selected patches outlined."""
    from vitcli import figures

    fig, (panel,) = figures.figure(size=7.0)
    figures.show_crop(panel, crop)
    figures.draw_grid(panel, result.grid, numbers=True)
    for detail in result.selected:
        figures.outline(panel, result.grid.pixel_box(detail.patch), color="yellow", width=2.5)
    grid = result.grid
    figures.title(
        fig,
        f"{result.source.path.name}: {grid.image_height}x{grid.image_width} crop, {grid.rows}x{grid.cols} patches of "
        f"{grid.patch_size}px (P1..P{grid.num_patches}, row by row)",
        result.weights,
    )
    return fig
