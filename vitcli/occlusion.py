"""Occlusion experiments: cover pixels of the model input with a fill and measure how the target probability falls.

Every test starts from a fresh copy of the normalized input (`PreparedImage.input`), so covers never accumulate;
only pixels change, never tokens or the attention. Covered copies are built lazily, one batch at a time, so peak
memory is bounded by the batch size, not by the number of covers. Drops are 100 x (clean - covered probability)
in percentage points: positive means the probability fell.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from rich.console import Group
from rich.table import Table
from torch import Tensor

from vitcli.errors import UsageError
from vitcli.grid import PatchGrid
from vitcli.images import ImageSource
from vitcli.model import PreparedImage, VitModel
from vitcli.render import weights_caption

FILLS = ("gray", "black", "white", "mean", "blur")
QUADRANTS = ("top-left", "top-right", "bottom-left", "bottom-right")
# Batching changes float32 sums slightly (about 1e-7 in probability): smaller changes count as "unchanged".
UNCHANGED_PROBABILITY = 1e-6


# ----- what is covered


@dataclass(frozen=True)
class Cover:
    """One covered region: a (left, top, right, bottom) pixel box, right and bottom exclusive."""

    name: str  # a quadrant name, Pn for a window that is exactly patch n, else Wn (windows counted from 1)
    row: int  # zero-based position in the grid of windows (for patch-sized windows: the patch grid)
    col: int
    box: tuple[int, int, int, int]
    patch: int | None = None  # n when the box is exactly patch Pn

    def describe(self) -> dict[str, Any]:
        left, top, right, bottom = self.box
        return {"cover": self.name, "patch": f"P{self.patch}" if self.patch else "", "row": self.row, "col": self.col,
                "left": left, "top": top, "right": right, "bottom": bottom}


def quadrant_covers(grid: PatchGrid) -> list[Cover]:
    """The four quadrants of the input, row by row: top-left, top-right, bottom-left, bottom-right."""
    half_height, half_width = grid.image_height // 2, grid.image_width // 2
    covers = []
    for index, name in enumerate(QUADRANTS):
        row, col = divmod(index, 2)
        box = (col * half_width, row * half_height, (col + 1) * half_width, (row + 1) * half_height)
        covers.append(Cover(name, row, col, box))
    return covers


@dataclass(frozen=True)
class SlidingWindows:
    """Square windows of `size` pixels moved by `stride` over the input, row by row, never past its edge."""

    grid: PatchGrid
    size: int
    stride: int

    def __post_init__(self) -> None:
        side = min(self.grid.image_height, self.grid.image_width)
        if not 1 <= self.size <= side:
            raise UsageError(f"--size must be between 1 and {side} pixels (the input's side), not {self.size}")
        if self.stride < 1:
            raise UsageError(f"--stride must be at least 1 pixel, not {self.stride}")

    @property
    def rows(self) -> int:
        return (self.grid.image_height - self.size) // self.stride + 1

    @property
    def cols(self) -> int:
        return (self.grid.image_width - self.size) // self.stride + 1

    def __len__(self) -> int:
        return self.rows * self.cols

    def __iter__(self) -> Iterator[Cover]:
        patch_aligned = self.size == self.grid.patch_size and self.stride % self.grid.patch_size == 0
        for row in range(self.rows):
            for col in range(self.cols):
                left, top = col * self.stride, row * self.stride
                box = (left, top, left + self.size, top + self.size)
                if patch_aligned:
                    patch = self.grid.patch_at(top // self.size, left // self.size)
                    yield Cover(f"P{patch}", row, col, box, patch)
                else:
                    yield Cover(f"W{row * self.cols + col + 1}", row, col, box)


# ----- fills


def fill_image(model: VitModel, prepared: PreparedImage, fill: str) -> Tensor:
    """The (3, H, W) normalized image whose pixels replace covered ones.

    gray: pixel = the checkpoint's normalization mean (normalized 0); black: pixel 0; white: pixel 1;
    mean: this image's per-channel mean pixel; blur: this image blurred with a Gaussian of sigma = half a patch.
    """
    if fill not in FILLS:
        raise UsageError(f"unknown fill {fill!r}: choose one of {', '.join(FILLS)}")
    image = prepared.input
    if fill == "blur":
        import torchvision.transforms.functional as transforms

        sigma = model.grid.patch_size / 2
        kernel = 2 * math.ceil(3 * sigma) + 1
        # Normalization is a per-channel affine map and the kernel sums to one, so blurring the normalized input
        # equals normalizing the blurred pixels.
        return transforms.gaussian_blur(image.unsqueeze(0), [kernel, kernel], [sigma, sigma]).squeeze(0)
    if fill == "mean":
        return image.mean(dim=(1, 2), keepdim=True).expand_as(image).clone()
    mean = torch.tensor(model.mean).reshape(3, 1, 1)
    std = torch.tensor(model.std).reshape(3, 1, 1)
    pixel = {"gray": mean, "black": torch.zeros(3, 1, 1), "white": torch.ones(3, 1, 1)}[fill]
    return ((pixel - mean) / std).expand_as(image).clone()


def paint(image: Tensor, fill: Tensor, box: tuple[int, int, int, int]) -> None:
    """Replace the box of a (3, H, W) image, in place, by the same box of the fill."""
    left, top, right, bottom = box
    image[:, top:bottom, left:right] = fill[:, top:bottom, left:right]


def covered_copy(image: Tensor, fill: Tensor, cover: Cover) -> Tensor:
    copy = image.clone()
    paint(copy, fill, cover.box)
    return copy


def covered_batches(image: Tensor, fill: Tensor, covers: Sequence[Cover], batch_size: int) -> Iterator[Tensor]:
    """(B, 3, H, W) batches of covered copies, each a fresh copy of the image with one cover painted."""
    for start in range(0, len(covers), batch_size):
        chunk = covers[start : start + batch_size]
        batch = image.expand(len(chunk), *image.shape).clone()
        for copy, cover in zip(batch, chunk):
            paint(copy, fill, cover.box)
        yield batch


# ----- the target class


@dataclass(frozen=True)
class ClassProbability:
    index: int
    label: str
    probability: float

    def short(self) -> str:
        return f"{self.index} {self.label.split(',')[0]} ({self.probability:.4f})"


def resolve_target(model: VitModel, text: str | None, clean: Tensor) -> int:
    """The class to follow: the clean top-1, a class index, or a label matched case-insensitively."""
    if text is None:
        return int(clean.argmax())
    cleaned = text.strip()
    if cleaned.isdigit():
        index = int(cleaned)
        if index >= model.num_classes:
            raise UsageError(f"--target {index} does not exist: class indexes are 0..{model.num_classes - 1}")
        return index
    wanted = cleaned.casefold()
    labels = [label.casefold() for label in model.labels]
    stages = [
        [index for index, label in enumerate(labels) if label == wanted],
        [index for index, label in enumerate(labels) if wanted in (name.strip() for name in label.split(","))],
        [index for index, label in enumerate(labels) if wanted in label],
    ]
    for matches in stages:
        if len(matches) == 1:
            return matches[0]
        if matches:
            listed = "; ".join(f"{index} {model.labels[index]}" for index in matches[:10])
            more = f" and {len(matches) - 10} more" if len(matches) > 10 else ""
            raise UsageError(f"--target {text!r} matches {len(matches)} classes: {listed}{more}; give the class index")
    close = difflib.get_close_matches(wanted, labels, n=3, cutoff=0.6)
    hint = "; close: " + "; ".join(f"{labels.index(c)} {model.labels[labels.index(c)]}" for c in close) if close else ""
    raise UsageError(f"--target {text!r} matches no class label{hint}; give a label or an index 0..{model.num_classes - 1}")


# ----- measuring


@dataclass(frozen=True)
class CoverOutcome:
    cover: Cover
    target_probability: float
    drop: float  # percentage points: 100 x (clean - covered); positive means the probability fell
    top1: ClassProbability  # of the covered image
    top1_changed: bool


@dataclass(frozen=True)
class Baseline:
    """The clean image's facts every experiment compares against."""

    source: ImageSource
    weights: str
    fill: str
    target: ClassProbability
    top1: ClassProbability

    def to_json(self) -> dict[str, Any]:
        return {
            "image": self.source.to_json(),
            "weights": self.weights,
            "fill": self.fill,
            "target": {"class_index": self.target.index, "label": self.target.label, "clean_probability": self.target.probability},
            "clean_top1": {"class_index": self.top1.index, "label": self.top1.label, "probability": self.top1.probability},
        }

    def row_prefix(self) -> dict[str, Any]:
        return {
            "image": str(self.source.path),
            "target_class": self.target.index,
            "target_label": self.target.label,
            "clean_probability": self.target.probability,
        }


def baseline(model: VitModel, prepared: PreparedImage, target: str | None, fill: str) -> Baseline:
    clean = model.probabilities(prepared.input.unsqueeze(0))[0]
    index = resolve_target(model, target, clean)
    top = int(clean.argmax())
    return Baseline(
        prepared.source,
        model.spec.label,
        fill,
        ClassProbability(index, model.labels[index], float(clean[index])),
        ClassProbability(top, model.labels[top], float(clean[top])),
    )


def measure_covers(
    model: VitModel,
    image: Tensor,
    fill: Tensor,
    covers: Sequence[Cover],
    base: Baseline,
    on_batch: Callable[[int], None] | None = None,
) -> list[CoverOutcome]:
    """Run every covered copy through the model's own forward, `model.batch_size` copies at a time."""
    outcomes = []
    done = 0
    for batch in covered_batches(image, fill, covers, model.batch_size):
        probabilities = model.probabilities(batch)
        best = probabilities.max(dim=-1)
        for row in range(len(batch)):
            covered = float(probabilities[row, base.target.index])
            top = int(best.indices[row])
            outcomes.append(
                CoverOutcome(
                    covers[done + row],
                    covered,
                    100.0 * (base.target.probability - covered),
                    ClassProbability(top, model.labels[top], float(best.values[row])),
                    top != base.top1.index,
                )
            )
        done += len(batch)
        if on_batch is not None:
            on_batch(len(batch))
    return outcomes


def outcome_fields(outcome: CoverOutcome) -> dict[str, Any]:
    return {
        **outcome.cover.describe(),
        "target_probability": outcome.target_probability,
        "drop_points": outcome.drop,
        "top1_class": outcome.top1.index,
        "top1_label": outcome.top1.label,
        "top1_probability": outcome.top1.probability,
        "top1_changed": outcome.top1_changed,
    }


def largest_drop(outcomes: Sequence[CoverOutcome]) -> CoverOutcome:
    return max(outcomes, key=lambda outcome: outcome.drop)


# ----- occlude-quadrants


@dataclass
class QuadrantResult:
    base: Baseline
    outcomes: list[CoverOutcome]

    @property
    def largest(self) -> CoverOutcome:
        return largest_drop(self.outcomes)

    def table(self) -> Table:
        base = self.base
        table = Table(
            title=f"{base.source.path}\n{base.fill} quadrants, target {base.target.short()}; * = top-1 changed",
            caption=weights_caption(base.weights),
        )
        for column in ("region", "box l,t,r,b", "target p", "drop (pts)", "top-1 after", "max"):
            table.add_column(
                column, justify="right" if column in ("target p", "drop (pts)") else "left",
                no_wrap=column == "box l,t,r,b",
            )
        largest = self.largest
        for outcome in self.outcomes:
            table.add_row(
                outcome.cover.name,
                _box_text(outcome.cover.box),
                f"{outcome.target_probability:.6f}",
                _points(outcome.drop),
                _top1_after(outcome),
                "<-" if outcome is largest else "",
                style="bold" if outcome is largest else None,
            )
        return table

    def rows(self) -> list[dict[str, Any]]:
        largest = self.largest
        return [
            {
                **self.base.row_prefix(),
                "region": outcome.cover.name,
                **{key: value for key, value in outcome_fields(outcome).items() if key not in ("cover", "patch")},
                "largest_drop": outcome is largest,
                "fill": self.base.fill,
                "weights": self.base.weights,
            }
            for outcome in self.outcomes
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            **self.base.to_json(),
            "largest_drop_region": self.largest.cover.name,
            "quadrants": [outcome_fields(outcome) for outcome in self.outcomes],
        }


def occlude_quadrants(model: VitModel, prepared: PreparedImage, target: str | None, fill: str) -> QuadrantResult:
    base = baseline(model, prepared, target, fill)
    covers = quadrant_covers(model.grid)
    return QuadrantResult(base, measure_covers(model, prepared.input, fill_image(model, prepared, fill), covers, base))


def quadrant_figure(model: VitModel, prepared: PreparedImage, result: QuadrantResult) -> Any:
    from vitcli.figures import figure, outline, show_crop, title

    fill = fill_image(model, prepared, result.base.fill)
    fig, panels = figure(5, size=3.2)
    show_crop(panels[0], prepared.crop_uint8())
    panels[0].set_title(f"clean\np = {result.base.target.probability:.4g}", fontsize=9)
    largest = result.largest
    for panel, outcome in zip(panels[1:], result.outcomes):
        show_crop(panel, _pixels_uint8(model, covered_copy(prepared.input, fill, outcome.cover)))
        outline(panel, outcome.cover.box)
        marker = "  (largest drop)" if outcome is largest else ""
        panel.set_title(
            f"{outcome.cover.name} covered{marker}\np = {outcome.target_probability:.4g}, drop {_points(outcome.drop)} pts",
            fontsize=9,
        )
    title(
        fig,
        f"{prepared.source.path.name}: probability of {result.base.target.index} {result.base.target.label.split(',')[0]}"
        f" with each quadrant covered ({result.base.fill} fill)",
        result.base.weights,
    )
    return fig


# ----- occlude-patches


def pixel_drop_map(covers: Sequence[Cover], drops: Sequence[float], grid: PatchGrid) -> Tensor:
    """(H, W) float64: each pixel's mean drop over the windows covering it; NaN where no window reaches."""
    total = torch.zeros(grid.image_height, grid.image_width, dtype=torch.float64)
    count = torch.zeros_like(total)
    for cover, drop in zip(covers, drops):
        left, top, right, bottom = cover.box
        total[top:bottom, left:right] += drop
        count[top:bottom, left:right] += 1
    return total / count


def patch_drop_grid(pixel_map: Tensor, grid: PatchGrid) -> Tensor:
    """(rows, cols): the mean of the pixel map over each patch's pixels (NaN if any of them is uncovered)."""
    size = grid.patch_size
    trimmed = pixel_map[: grid.rows * size, : grid.cols * size]
    return trimmed.reshape(grid.rows, size, grid.cols, size).mean(dim=(1, 3))


@dataclass
class PatchResult:
    base: Baseline
    size: int
    stride: int
    window_rows: int
    window_cols: int
    outcomes: list[CoverOutcome]
    drop_grid: Tensor  # (grid rows, grid cols), points
    uncovered_pixels: int

    @property
    def largest(self) -> CoverOutcome:
        return largest_drop(self.outcomes)

    def summary(self) -> dict[str, Any]:
        drops = [outcome.drop for outcome in self.outcomes]
        probabilities = [outcome.target_probability for outcome in self.outcomes]
        unchanged = 100.0 * UNCHANGED_PROBABILITY
        changed = [outcome for outcome in self.outcomes if outcome.top1_changed]
        largest = self.largest
        return {
            "covers": len(self.outcomes),
            "largest_drop_points": largest.drop,
            "largest_drop_cover": largest.cover.name,
            "largest_drop_patch": f"P{largest.cover.patch}" if largest.cover.patch else None,
            "largest_drop_row": largest.cover.row,
            "largest_drop_col": largest.cover.col,
            "largest_drop_box": list(largest.cover.box),
            "lowered": sum(drop > unchanged for drop in drops),
            "raised": sum(drop < -unchanged for drop in drops),
            "unchanged": sum(abs(drop) <= unchanged for drop in drops),
            "min_covered_probability": min(probabilities),
            "max_covered_probability": max(probabilities),
            "top1_changed": bool(changed),
            "top1_changed_covers": len(changed),
            "uncovered_pixels": self.uncovered_pixels,
        }

    def table(self) -> Group:
        base, summary, largest = self.base, self.summary(), self.largest
        facts = Table(
            title=f"{base.source.path}  {summary['covers']} covers of {self.size}x{self.size} px, stride {self.stride}, "
            f"{base.fill} fill: target {base.target.short()}",
            caption=weights_caption(base.weights),
            show_header=False,
        )
        facts.add_column("quantity")
        facts.add_column("value")
        facts.add_row("largest drop (points)", f"{_points(largest.drop)} at {_where(largest.cover)}")
        facts.add_row(
            "covers lowering / raising / not changing it",
            f"{summary['lowered']} / {summary['raised']} / {summary['unchanged']}",
        )
        facts.add_row(
            "target p under a cover: min .. max",
            f"{summary['min_covered_probability']:.6f} .. {summary['max_covered_probability']:.6f}",
        )
        facts.add_row(
            "top-1 changed",
            f"yes, by {summary['top1_changed_covers']} covers" if summary["top1_changed"] else f"no: stays {base.top1.short()}",
        )
        if self.uncovered_pixels:
            facts.add_row("pixels no window reaches", str(self.uncovered_pixels))
        strongest = Table(title="largest drops (* = top-1 changed)")
        for column in ("cover", "row", "col", "box l,t,r,b", "target p", "drop (pts)", "top-1 after"):
            strongest.add_column(
                column, justify="right" if column in ("row", "col", "target p", "drop (pts)") else "left",
                no_wrap=column == "box l,t,r,b",
            )
        for outcome in sorted(self.outcomes, key=lambda outcome: outcome.drop, reverse=True)[:5]:
            strongest.add_row(
                outcome.cover.name, str(outcome.cover.row), str(outcome.cover.col), _box_text(outcome.cover.box),
                f"{outcome.target_probability:.6f}", _points(outcome.drop), _top1_after(outcome),
            )
        return Group(facts, strongest)

    def rows(self) -> list[dict[str, Any]]:
        return [
            {**self.base.row_prefix(), **outcome_fields(outcome), "fill": self.base.fill, "weights": self.base.weights}
            for outcome in self.outcomes
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            **self.base.to_json(),
            "window": {"size": self.size, "stride": self.stride, "rows": self.window_rows, "cols": self.window_cols},
            "summary": self.summary(),
            "drop_grid_points": self.drop_grid.tolist(),
            "covers": [outcome_fields(outcome) for outcome in self.outcomes],
        }


def occlude_patches(
    model: VitModel,
    prepared: PreparedImage,
    windows: SlidingWindows,
    target: str | None,
    fill: str,
    on_batch: Callable[[int], None] | None = None,
) -> PatchResult:
    base = baseline(model, prepared, target, fill)
    covers = list(windows)
    outcomes = measure_covers(model, prepared.input, fill_image(model, prepared, fill), covers, base, on_batch)
    pixel_map = pixel_drop_map(covers, [outcome.drop for outcome in outcomes], model.grid)
    return PatchResult(
        base, windows.size, windows.stride, windows.rows, windows.cols, outcomes,
        patch_drop_grid(pixel_map, model.grid), int(pixel_map.isnan().sum()),
    )


def patch_figure(model: VitModel, prepared: PreparedImage, result: PatchResult) -> Any:
    from vitcli.figures import draw_grid, figure, outline, overlay, show_crop, title

    covers = [outcome.cover for outcome in result.outcomes]
    pixel_map = pixel_drop_map(covers, [outcome.drop for outcome in result.outcomes], model.grid).numpy()
    reach = float(abs(torch.tensor([outcome.drop for outcome in result.outcomes])).max()) or 1e-9
    fig, panels = figure(2, size=4.5)
    crop = prepared.crop_uint8()
    show_crop(panels[0], crop)
    draw_grid(panels[0], model.grid)
    panels[0].set_title("input crop", fontsize=9)
    mappable = overlay(panels[1], crop, pixel_map, "RdBu_r", -reach, reach, alpha=0.75)
    largest = result.largest
    outline(panels[1], largest.cover.box, color="black", width=2.5)
    panels[1].set_title(
        f"drop map, colour scale centred on 0\noutlined: largest drop, {largest.cover.name} "
        f"(row {largest.cover.row}, col {largest.cover.col})\n{_points(largest.drop)} points",
        fontsize=9,
    )
    fig.colorbar(mappable, ax=panels, shrink=0.8, pad=0.03, label="drop in percentage points (red: probability fell)")
    title(
        fig,
        f"{prepared.source.path.name}: drop in probability of {result.base.target.index} "
        f"{result.base.target.label.split(',')[0]} ({len(covers)} covers {result.size}x{result.size} px, "
        f"stride {result.stride}, {result.base.fill} fill)",
        result.base.weights,
    )
    return fig


# ----- presentation helpers


def _box_text(box: tuple[int, int, int, int]) -> str:
    return ",".join(str(value) for value in box)


def _top1_after(outcome: CoverOutcome) -> str:
    return f"{outcome.top1.index} {outcome.top1.label.split(',')[0]}" + ("*" if outcome.top1_changed else "")


def _points(drop: float) -> str:
    return f"{drop:+.4g}"


def _where(cover: Cover) -> str:
    return f"{cover.name} (row {cover.row}, col {cover.col}; box {_box_text(cover.box)})"


def _pixels_uint8(model: VitModel, image: Tensor):
    """A normalized (3, H, W) image back to (H, W, 3) uint8 pixels, for figures."""
    mean = torch.tensor(model.mean).reshape(3, 1, 1)
    std = torch.tensor(model.std).reshape(3, 1, 1)
    pixels = image * std + mean
    return (pixels.permute(1, 2, 0) * 255).round().clamp(0, 255).to(torch.uint8).numpy()
