"""Generated scenes with known object masks: the ground truth that explanation benchmarks grade against.

Every scene is a pure function of `(seed, index, kind)`: its random stream is `numpy.random.default_rng((seed,
index, KIND_CODE[kind]))`, so scene 7 is the same whether it is drawn alone or as the 8th of a run, and two seeds
share nothing. numpy and PIL only (no torch): the benchmark and its tests can draw thousands of scenes cheaply.

kind "single" (224x224):
- one object of class `label` (CLASS_NAMES: circle, square, triangle, star, cross, ring). A class is a shape AND its
  own texture (TEXTURES, in the same order): circle stripes, square dots, triangle checker, star waves (a sine
  across bands, in eight shades), cross zigzag, ring speckle (cells of half a period, each of the two colours at
  random). Both tell the class: the texture in every patch of the object, the shape over the whole. The texture's
  two colours (random RGB whose brightnesses differ by at least 80 of 255), period (5 to 9 px) and angle, the
  object's rotation, size and position are drawn per object independently of the class. A class-linked texture is
  what makes the task learnable by a small ViT from scratch on a CPU in minutes (shape alone, at any rotation, scale
  and colour, was not: held-out accuracy stayed near 0.3); the ground truth is unchanged: the class's evidence is
  the object's pixels and nothing else, since nothing outside the object carries these textures; its size (a
  circumscribed radius of 28 to 56 px, 56 to 112 px across) spans 4 to 7 patches of 16 px a side;
- a cluttered background without any periodic texture: a linear gradient between two random colours at a random
  angle, plus smooth colour blobs (bicubic up-sampling of 4x4 random colours), plus per-pixel noise of random
  strength;
- 3 to 7 distractors that belong to no class, each of one plain colour: thin lines (1 to 3 px wide) and small
  irregular blobs (radius 4 to 10 px, 5 to 8 jittered vertices). A distractor is redrawn elsewhere if it comes
  within 3 px of the object, so distractors never touch the mask;
- `mask` is exactly the object's pixels: the object is painted with hard edges (no anti-aliasing) over the
  background, every pixel of the mask is the object's texture and no other pixel is.

kind "mosaic" (Focus, Arias-Duart et al. 2022): a 2x2 mosaic of four single scenes of 112x112 (each drawn at that
size with every length halved, which equals a 224 scene scaled down by two but keeps its mask exact). The target
class `label` fills two quadrants, the other two hold objects of two other classes (distinct from the target; the
Focus paper's protocol). `quadrants` lists the target quadrants (0 top-left, 1 top-right, 2 bottom-left, 3
bottom-right) and `mask` is the union of the target objects' masks.

kind "bam" (after BAM, Yang and Kim 2019): an object of class A pasted onto the background of another scene whose
object is of a class B != A, with B's object removed. Here backgrounds carry no class (a single scene's background
is drawn independently of its class, and the shapes model is trained on single scenes), so "the background of
another class" is literally the background and distractors of another scene (the donor, of class B, drawn from the same
stream) without its object: the donor's background and distractors, which keep clear of the donor's own object
(left as bare background, as if inpainted) and of the pasted object. The pasted object is drawn like a single
scene's (class A's shape and texture, random colours, size, place). A model that reads the object only is as accurate
on bam scenes as on single ones.

`write_folder` writes scenes as IMAGE.png, masks/IMAGE.png (0 and 255) and labels.csv (file, label, class, kind,
quadrants), the layout `vitcli bench` reads; the `vitcli scenes` command writes through the output store.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

CLASS_NAMES: tuple[str, ...] = ("circle", "square", "triangle", "star", "cross", "ring")
KINDS: tuple[str, ...] = ("single", "mosaic", "bam")
KIND_CODE = {"single": 0, "mosaic": 1, "bam": 2}
SIZE = 224
# Each class has its own texture (same order as CLASS_NAMES): every object patch carries local evidence of the
# class, which a small ViT trained on 2 CPU cores learns; its shape alone (at any rotation and scale, in any colour)
# it does not learn in that budget. Backgrounds (smooth gradients, blobs, noise) and distractors (plain) carry none.
TEXTURES: tuple[str, ...] = ("stripes", "dots", "checker", "waves", "zigzag", "speckle")
WAVE_SHADES = 8  # "waves" steps from one colour to the other in this many shades: the one texture with blends
RADIUS_RANGE = (28.0, 56.0)  # circumscribed radius in px at 224: 56 to 112 px across, 4 to 7 patches of 16
DISTRACTOR_MARGIN = 3  # px between a distractor and the object's mask
LUMA_CONTRAST = 80  # least brightness difference between a texture's two colours
PERIOD_RANGE = (5.0, 9.0)  # texture period in px at 224: about two to three per 16-px patch


@dataclass(frozen=True)
class Scene:
    image: np.ndarray  # (224, 224, 3) uint8
    mask: np.ndarray  # (224, 224) bool: the target object's pixels (mosaic: the target quadrants' objects)
    label: int  # index into CLASS_NAMES
    kind: str  # "single" | "mosaic" | "bam"
    quadrants: tuple[int, ...] = ()  # mosaic: target quadrants, 0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right

    @property
    def class_name(self) -> str:
        return CLASS_NAMES[self.label]


@dataclass(frozen=True)
class ShapeObject:
    """One object, everything needed to paint it: `paint_object` on any canvas gives the same pixels."""

    label: int
    centre: tuple[float, float]  # (x, y) in px
    radius: float
    angle: float  # radians
    texture: str
    colours: tuple[tuple[int, int, int], tuple[int, int, int]]
    period: float  # texture period in px
    texture_angle: float


@dataclass(frozen=True)
class SceneParts:
    """A single scene before it is composed: its background with distractors, and its object."""

    clutter: np.ndarray  # (size, size, 3) uint8: background and distractors, no object
    distractors: np.ndarray  # (size, size) bool: the distractors' pixels
    obj: ShapeObject


@dataclass(frozen=True)
class Layout:
    """What a scene is made of, before its pixels are composed (tests and benchmarks read the parts)."""

    kind: str
    label: int
    parts: tuple[SceneParts, ...]  # single and bam: one (bam: the donor's clutter, the pasted object); mosaic: four
    quadrants: tuple[int, ...] = ()
    donor_label: int | None = None  # bam: the class of the scene whose background was taken


def layout(seed: int, index: int, kind: str = "single") -> Layout:
    """The parts of scene `index` of the series `seed` (both >= 0): deterministic in (seed, index, kind)."""
    if kind not in KIND_CODE:
        raise ValueError(f"unknown scene kind {kind!r}: one of {', '.join(KINDS)}")
    if seed < 0 or index < 0:
        raise ValueError("seed and index must be >= 0")
    rng = np.random.default_rng((seed, index, KIND_CODE[kind]))
    if kind == "single":
        parts = single_parts(rng, SIZE)
        return Layout(kind, parts.obj.label, (parts,))
    if kind == "mosaic":
        target, quadrants, labels = mosaic_labels(rng)
        quarters = tuple(single_parts(rng, SIZE // 2, label) for label in labels)
        return Layout(kind, target, quarters, quadrants)
    obj = _random_object(rng, int(rng.integers(len(CLASS_NAMES))), SIZE, 1.0)
    donor_label = int(rng.choice([c for c in range(len(CLASS_NAMES)) if c != obj.label]))
    pasted = _dilate(object_mask(obj, SIZE), DISTRACTOR_MARGIN)
    donor = single_parts(rng, SIZE, donor_label, keep_clear=pasted)  # its object is never painted: removed
    return Layout(kind, obj.label, (SceneParts(donor.clutter, donor.distractors, obj),), donor_label=donor_label)


def render(drawn: Layout) -> Scene:
    """The scene's pixels and mask from its parts."""
    if drawn.kind != "mosaic":
        image, mask = compose(drawn.parts[0])
        return Scene(image, mask, drawn.label, drawn.kind)
    half = SIZE // 2
    image = np.empty((SIZE, SIZE, 3), np.uint8)
    mask = np.zeros((SIZE, SIZE), bool)
    for quadrant, parts in enumerate(drawn.parts):
        part_image, part_mask = compose(parts)
        top, left = half * (quadrant // 2), half * (quadrant % 2)
        image[top : top + half, left : left + half] = part_image
        if quadrant in drawn.quadrants:
            mask[top : top + half, left : left + half] = part_mask
    return Scene(image, mask, drawn.label, drawn.kind, drawn.quadrants)


def scene(seed: int, index: int, kind: str = "single") -> Scene:
    """Scene `index` of the series `seed` (both >= 0): deterministic in (seed, index, kind), whatever else is drawn."""
    return render(layout(seed, index, kind))


def scenes(seed: int, count: int, kind: str = "single") -> Iterator[Scene]:
    """Scenes 0 .. count-1 of the series `seed`."""
    for index in range(count):
        yield scene(seed, index, kind)


def single_parts(
    rng: np.random.Generator, size: int, label: int | None = None, keep_clear: np.ndarray | None = None
) -> SceneParts:
    """Draw a single scene's parts at `size` px (224, or 112 for a mosaic quadrant) from `rng`; distractors keep
    clear of the object and of `keep_clear` too (a bam scene's pasted object)."""
    scale = size / SIZE
    if label is None:
        label = int(rng.integers(len(CLASS_NAMES)))
    obj = _random_object(rng, label, size, scale)
    clutter = background(rng, size)
    forbidden = _dilate(object_mask(obj, size), round(DISTRACTOR_MARGIN * max(scale, 0.5)))
    if keep_clear is not None:
        forbidden = forbidden | keep_clear
    distractors = _add_distractors(rng, clutter, forbidden, scale)
    return SceneParts(clutter, distractors, obj)


def compose(parts: SceneParts) -> tuple[np.ndarray, np.ndarray]:
    """The image (clutter with the object painted over it) and the object's mask."""
    image = parts.clutter.copy()
    mask = paint_object(image, parts.obj)
    return image, mask


def object_mask(obj: ShapeObject, size: int) -> np.ndarray:
    """The object's pixels on a (size, size) canvas: its shape drawn with hard edges."""
    layer = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(layer)
    x, y = obj.centre
    name = CLASS_NAMES[obj.label]
    if name in ("circle", "ring"):
        r = obj.radius
        draw.ellipse((x - r, y - r, x + r, y + r), fill=255)
        if name == "ring":
            inner = 0.55 * r
            draw.ellipse((x - inner, y - inner, x + inner, y + inner), fill=0)
    else:
        draw.polygon(_outline(name, obj), fill=255)
    return np.asarray(layer) > 0


def paint_object(canvas: np.ndarray, obj: ShapeObject) -> np.ndarray:
    """Paint the object's texture over its pixels on `canvas` (in place); returns its mask."""
    size = canvas.shape[0]
    mask = object_mask(obj, size)
    rows, columns = np.nonzero(mask)
    if rows.size:
        canvas[rows, columns] = _texture(obj, columns.astype(np.float32), rows.astype(np.float32))
    return mask


def background(rng: np.random.Generator, size: int) -> np.ndarray:
    """Clutter without distractors: a colour gradient, smooth colour blobs and pixel noise."""
    start, end = rng.integers(0, 256, (2, 3)).astype(np.float32)
    angle = rng.uniform(0, 2 * math.pi)
    ramp = np.linspace(-0.5, 0.5, size, dtype=np.float32)
    along = math.cos(angle) * ramp[None, :] + math.sin(angle) * ramp[:, None] + 0.5  # 0..1 roughly
    image = start + (end - start) * along[:, :, None]
    blobs = Image.fromarray(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)).resize((size, size), Image.BICUBIC)
    image = image * np.float32(0.6) + np.asarray(blobs, dtype=np.float32) * np.float32(0.4)
    image += rng.standard_normal((size, size, 1), dtype=np.float32) * np.float32(rng.uniform(2.0, 18.0))
    return np.clip(image, 0, 255, out=image).astype(np.uint8)


def mosaic_labels(rng: np.random.Generator) -> tuple[int, tuple[int, ...], list[int]]:
    """The Focus protocol: a target class, its two quadrants, and the class of each of the four quadrants (two
    other classes, distinct from the target)."""
    target = int(rng.integers(len(CLASS_NAMES)))
    others = [c for c in range(len(CLASS_NAMES)) if c != target]
    other = [int(c) for c in rng.choice(others, size=2, replace=False)]
    quadrants = tuple(sorted(int(q) for q in rng.choice(4, size=2, replace=False)))
    labels = [target if q in quadrants else other.pop() for q in range(4)]
    return target, quadrants, labels


def _random_object(rng: np.random.Generator, label: int, size: int, scale: float) -> ShapeObject:
    radius = rng.uniform(*RADIUS_RANGE) * scale
    margin = radius + 2
    centre = (float(rng.uniform(margin, size - margin)), float(rng.uniform(margin, size - margin)))
    colours = rng.integers(0, 256, (2, 3))
    while abs(_luma(colours[0]) - _luma(colours[1])) < LUMA_CONTRAST:  # the texture shows in brightness too
        colours = rng.integers(0, 256, (2, 3))
    return ShapeObject(
        label=label,
        centre=centre,
        radius=float(radius),
        angle=float(rng.uniform(0, 2 * math.pi)),
        texture=TEXTURES[label],
        colours=(tuple(int(v) for v in colours[0]), tuple(int(v) for v in colours[1])),
        period=float(rng.uniform(*PERIOD_RANGE) * scale),
        texture_angle=float(rng.uniform(0, math.pi)),
    )


def _luma(colour: np.ndarray) -> float:
    """Brightness (ITU-R BT.601 weights) of an RGB colour, 0 to 255."""
    return float(0.299 * colour[0] + 0.587 * colour[1] + 0.114 * colour[2])


def _outline(name: str, obj: ShapeObject) -> list[tuple[float, float]]:
    if name == "square":
        corners = [(1, 1), (-1, 1), (-1, -1), (1, -1)]
        points = [(x / math.sqrt(2), y / math.sqrt(2)) for x, y in corners]
    elif name == "triangle":
        points = [(math.cos(a), math.sin(a)) for a in np.arange(3) * 2 * math.pi / 3]
    elif name == "star":
        points = [
            (rho * math.cos(a), rho * math.sin(a))
            for k, a in enumerate(np.arange(10) * math.pi / 5)
            for rho in [1.0 if k % 2 == 0 else 0.42]
        ]
    elif name == "cross":
        w = 0.3  # half the arm's width, the arm's length being 1
        points = [
            (w, w),
            (w, 1),
            (-w, 1),
            (-w, w),
            (-1, w),
            (-1, -w),
            (-w, -w),
            (-w, -1),
            (w, -1),
            (w, -w),
            (1, -w),
            (1, w),
        ]
        points = [(x / math.hypot(1, w), y / math.hypot(1, w)) for x, y in points]
    else:
        raise ValueError(f"no outline for {name}")
    cos, sin = math.cos(obj.angle), math.sin(obj.angle)
    x0, y0 = obj.centre
    r = obj.radius
    return [(x0 + r * (cos * x - sin * y), y0 + r * (sin * x + cos * y)) for x, y in points]


def _texture(obj: ShapeObject, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The object's colour at pixels (x, y): (n, 3) uint8, one of its two colours in its class's pattern."""
    first, second = (np.array(c, np.uint8) for c in obj.colours)
    cos, sin = math.cos(obj.texture_angle), math.sin(obj.texture_angle)
    u = (cos * x + sin * y) / obj.period
    v = (-sin * x + cos * y) / obj.period
    if obj.texture == "stripes":  # parallel bands, half a period each
        second_colour = (np.floor(u) % 2).astype(bool)
    elif obj.texture == "checker":
        second_colour = ((np.floor(u) + np.floor(v)) % 2).astype(bool)
    elif obj.texture == "dots":  # a disc of radius 0.3 period in each cell
        second_colour = (u - np.floor(u) - 0.5) ** 2 + (v - np.floor(v) - 0.5) ** 2 < 0.0625
    elif obj.texture == "waves":  # a sine across the bands, in WAVE_SHADES steps from one colour to the other
        steps = np.round((0.5 + 0.5 * np.sin(math.pi * u)) * (WAVE_SHADES - 1)) / (WAVE_SHADES - 1)
        blend = first + (second.astype(np.float32) - first) * steps[:, None].astype(np.float32)
        return np.round(blend).astype(np.uint8)
    elif obj.texture == "zigzag":  # bands bent into a zigzag of one period's amplitude
        bent = u + np.abs((v % 2) - 1)
        second_colour = (np.floor(bent) % 2).astype(bool)
    else:  # speckle: cells of half a period, each one colour at random (a hash of the cell and the object)
        cells = (np.floor(u * 2).astype(np.int64) * 73856093) ^ (np.floor(v * 2).astype(np.int64) * 19349663)
        salt = int(obj.texture_angle * 1e6)
        mixed = (cells ^ salt) * 2654435761 % (1 << 32)
        second_colour = ((mixed >> 15) & 1).astype(bool)
    return np.where(second_colour[:, None], second, first)


def _add_distractors(rng: np.random.Generator, canvas: np.ndarray, forbidden: np.ndarray, scale: float) -> np.ndarray:
    """Paint 3 to 7 distractors on `canvas` (in place), none touching `forbidden`; returns their pixels."""
    size = canvas.shape[0]
    painted = np.zeros((size, size), bool)
    for _ in range(int(rng.integers(3, 8))):
        for _attempt in range(8):
            layer = Image.new("L", (size, size), 0)
            draw = ImageDraw.Draw(layer)
            if rng.random() < 0.5:
                ends = rng.uniform(0, size, 4)
                width = max(1, round(rng.integers(1, 4) * scale))
                draw.line([(ends[0], ends[1]), (ends[2], ends[3])], fill=255, width=width)
            else:
                x, y = rng.uniform(0, size, 2)
                radius = rng.uniform(4, 10) * scale
                count = int(rng.integers(5, 9))
                angles = np.sort(rng.uniform(0, 2 * math.pi, count))
                radii = radius * rng.uniform(0.5, 1.0, count)
                draw.polygon(
                    [(x + r * math.cos(a), y + r * math.sin(a)) for a, r in zip(angles, radii, strict=True)], fill=255
                )
            pixels = np.asarray(layer) > 0
            colour = rng.integers(0, 256, 3)
            if not (pixels & forbidden).any():
                canvas[pixels] = colour
                painted |= pixels
                break
    return painted


def _dilate(mask: np.ndarray, pixels: int) -> np.ndarray:
    """`mask` grown by `pixels` in every direction (a square structuring element), by shifted ORs."""
    grown = mask.copy()
    for _ in range(pixels):
        grown[1:] |= grown[:-1].copy()
        grown[:-1] |= grown[1:].copy()
        grown[:, 1:] |= grown[:, :-1].copy()
        grown[:, :-1] |= grown[:, 1:].copy()
    return grown


LABELS_FILE = "labels.csv"
LABELS_HEADER = ("file", "label", "class", "kind", "quadrants")


def png_bytes(array: np.ndarray) -> bytes:
    """A lossless PNG of an RGB image (uint8) or of a mask (bool: 0 and 255, one channel)."""
    if array.dtype == bool:
        array = array.astype(np.uint8) * 255
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG", optimize=False, compress_level=6)
    return buffer.getvalue()


def scene_name(kind: str, index: int) -> str:
    """The file stem of scene `index`: e.g. single-00007."""
    return f"{kind}-{index:05d}"


def labels_row(name: str, item: Scene) -> dict[str, str]:
    """One row of labels.csv; `quadrants` is space-separated (empty unless a mosaic)."""
    return {
        "file": f"{name}.png",
        "label": str(item.label),
        "class": item.class_name,
        "kind": item.kind,
        "quadrants": " ".join(str(q) for q in item.quadrants),
    }


def labels_csv(rows: list[dict[str, str]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=LABELS_HEADER, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def write_folder(root: Path, seed: int, count: int, kind: str = "single") -> list[dict[str, str]]:
    """Write scenes 0 .. count-1 of (seed, kind) into `root` through the output store: NAME.png, masks/NAME.png
    (0 and 255) and labels.csv. Returns labels.csv's rows."""
    from vitcli.store import OutputStore, ResultFiles  # the store only for writing: drawing stays light

    store = OutputStore(root)
    images, masks = store.folder(), store.folder("masks")
    rows = []
    for index, item in enumerate(scenes(seed, count, kind)):
        name = scene_name(kind, index)
        record = {"command": "scenes", "seed": seed, "index": index, "kind": kind}
        store.write(images, ResultFiles(name, {"png": png_bytes(item.image)}, record))
        store.write(masks, ResultFiles(name, {"png": png_bytes(item.mask)}, record))
        rows.append(labels_row(name, item))
    store.write(images, ResultFiles("labels", {"csv": labels_csv(rows)}, {"command": "scenes", "seed": seed}))
    return rows


def read_folder(root: Path) -> Iterator[tuple[str, np.ndarray, np.ndarray, dict[str, str]]]:
    """Read back what `write_folder` wrote: (file, image, mask, labels row) per row of labels.csv."""
    with open(root / LABELS_FILE, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        image = np.asarray(Image.open(root / row["file"]).convert("RGB"))
        mask = np.asarray(Image.open(root / "masks" / row["file"]).convert("L")) > 127
        yield row["file"], image, mask, row
