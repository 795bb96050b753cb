"""The scene generator (vitcli.scenes): determinism, exact masks, distractors clear of the object, mosaics that hold
what they say, and the folder layout's PNG round trip."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from vitcli import scenes
from vitcli.scenes import CLASS_NAMES, KINDS, SIZE, compose, layout, paint_object, scene

PATCH = 16


@pytest.mark.parametrize("kind", KINDS)
def test_a_scene_depends_on_its_seed_index_and_kind_alone(kind):
    alone = scene(3, 5, kind)
    again = scene(3, 5, kind)
    in_a_run = list(scenes.scenes(3, 7, kind))[5]
    for other in (again, in_a_run):
        assert np.array_equal(alone.image, other.image)
        assert np.array_equal(alone.mask, other.mask)
        assert (alone.label, alone.kind, alone.quadrants) == (other.label, other.kind, other.quadrants)
    assert alone.image.shape == (SIZE, SIZE, 3) and alone.image.dtype == np.uint8
    assert alone.mask.shape == (SIZE, SIZE) and alone.mask.dtype == bool
    assert alone.kind == kind


@pytest.mark.parametrize("kind", KINDS)
def test_other_seeds_and_indices_give_other_scenes(kind):
    first = scene(0, 0, kind)
    assert not np.array_equal(first.image, scene(1, 0, kind).image)
    assert not np.array_equal(first.image, scene(0, 1, kind).image)


def test_every_class_is_drawn_about_equally_often():
    counts = np.bincount([item.label for item in scenes.scenes(0, 240)], minlength=len(CLASS_NAMES))
    assert counts.min() >= 240 / len(CLASS_NAMES) / 2


@pytest.mark.parametrize("kind", KINDS)
def test_each_class_has_its_own_texture_in_two_colours(kind):
    """The class decides the texture (docs/scenes.md's table), and the object's pixels show both its colours (a
    texture always shows) and no others, but for waves' evenly spaced blends between them."""
    assert len(set(scenes.TEXTURES)) == len(CLASS_NAMES)
    for index in range(20):
        for parts in layout(3, index, kind).parts:
            obj = parts.obj
            assert obj.texture == scenes.TEXTURES[obj.label]
            canvas = np.zeros_like(parts.clutter)  # 112 px for a mosaic's quadrant
            mask = paint_object(canvas, obj)
            shown = {tuple(int(v) for v in pixel) for pixel in canvas[mask]}
            first, second = np.array(obj.colours, float)
            shades = scenes.WAVE_SHADES if obj.texture == "waves" else 2
            allowed = {
                tuple(int(v) for v in np.round(first + (second - first) * k / (shades - 1))) for k in range(shades)
            }
            assert set(obj.colours) <= shown <= allowed


@pytest.mark.parametrize("kind", ["single", "bam"])
def test_the_mask_is_exactly_the_pixels_the_object_changes(kind):
    """Painted alone on a black and on a white canvas, the object changes exactly the mask's pixels (no pixel of an
    object can be both black and white), and the scene holds the object's own colours there."""
    for index in range(20):
        item = scene(2, index, kind)
        obj = layout(2, index, kind).parts[0].obj
        on_black = np.zeros((SIZE, SIZE, 3), np.uint8)
        on_white = np.full((SIZE, SIZE, 3), 255, np.uint8)
        paint_object(on_black, obj)
        paint_object(on_white, obj)
        changed = (on_black != 0).any(axis=2) | (on_white != 255).any(axis=2)
        assert np.array_equal(changed, item.mask)
        assert np.array_equal(item.image[item.mask], on_black[item.mask])


@pytest.mark.parametrize("name", CLASS_NAMES)
def test_a_mask_has_its_shapes_area(name):
    """The masks' areas against the shapes' geometry (circumscribed radius r): a disc pi r^2, a square 2 r^2, an
    equilateral triangle 3 sqrt(3)/4 r^2, the ring's annulus pi r^2 (1 - 0.55^2), the star and the cross their
    polygons' areas (shoelace formula over the outline), each within one pixel per unit of perimeter: edge pixels
    are drawn whole or not at all."""
    label = CLASS_NAMES.index(name)
    parts = next(
        part for index in range(200) for part in layout(5, index).parts if part.obj.label == label
    )  # the first scene of this class
    obj = parts.obj
    r = obj.radius
    if name in ("circle", "ring"):
        inner = 0.55 * r if name == "ring" else 0.0
        expected, perimeter = math.pi * (r * r - inner * inner), 2 * math.pi * (r + inner)
    else:
        points = np.array(scenes._outline(name, obj))
        x, y = points[:, 0], points[:, 1]
        expected = 0.5 * abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1)))
        perimeter = np.hypot(*(points - np.roll(points, 1, axis=0)).T).sum()
        if name == "square":
            assert expected == pytest.approx(2 * r * r)
        if name == "triangle":
            assert expected == pytest.approx(3 * math.sqrt(3) / 4 * r * r)
    area = compose(parts)[1].sum()
    assert abs(area - expected) <= perimeter


@pytest.mark.parametrize("kind", KINDS)
def test_distractors_never_touch_the_mask(kind):
    for index in range(40):
        for parts in layout(7, index, kind).parts:
            _, mask = compose(parts)
            assert parts.distractors.any()
            assert not (parts.distractors & scenes._dilate(mask, 2)).any()


def test_objects_span_several_patches():
    for item in scenes.scenes(4, 100):
        patches = item.mask.reshape(SIZE // PATCH, PATCH, SIZE // PATCH, PATCH).any(axis=(1, 3))
        assert patches.sum() >= 6


def test_mosaic_quadrants_hold_what_the_scene_says():
    half = SIZE // 2
    for index in range(30):
        item = scene(1, index, "mosaic")
        drawn = layout(1, index, "mosaic")
        assert len(item.quadrants) == 2 and len(set(item.quadrants)) == 2
        others = []
        for quadrant, parts in enumerate(drawn.parts):
            top, left = half * (quadrant // 2), half * (quadrant % 2)
            image, mask = compose(parts)
            assert np.array_equal(item.image[top : top + half, left : left + half], image)
            in_mask = item.mask[top : top + half, left : left + half]
            if quadrant in item.quadrants:
                assert parts.obj.label == item.label
                assert np.array_equal(in_mask, mask) and mask.any()
            else:
                others.append(parts.obj.label)
                assert not in_mask.any()
        assert item.label not in others and len(set(others)) == 2


def test_a_bam_object_sits_on_the_clutter_of_a_scene_of_another_class():
    for index in range(30):
        drawn = layout(6, index, "bam")
        item = scene(6, index, "bam")
        assert drawn.donor_label is not None and drawn.donor_label != item.label
        clutter = drawn.parts[0].clutter
        assert np.array_equal(item.image[~item.mask], clutter[~item.mask])


def test_the_folder_round_trips_through_png(tmp_path):
    rows = scenes.write_folder(tmp_path, 8, 4, "mosaic")
    read = list(scenes.read_folder(tmp_path))
    assert len(read) == 4
    for (file, image, mask, row), item in zip(read, scenes.scenes(8, 4, "mosaic"), strict=True):
        assert np.array_equal(image, item.image)
        assert np.array_equal(mask, item.mask)
        assert row == {
            "file": file,
            "label": str(item.label),
            "class": CLASS_NAMES[item.label],
            "kind": "mosaic",
            "quadrants": " ".join(map(str, item.quadrants)),
        }
    with open(tmp_path / "labels.csv", newline="") as handle:
        assert list(csv.DictReader(handle)) == rows
    masks = sorted(path.name for path in (tmp_path / "masks").glob("*.png"))
    assert masks == [row["file"] for row in rows]


@pytest.mark.parametrize(("seed", "index", "kind"), [(-1, 0, "single"), (0, -1, "single"), (0, 0, "collage")])
def test_bad_arguments_are_refused(seed, index, kind):
    with pytest.raises(ValueError):
        scene(seed, index, kind)


def test_the_shipped_examples_are_the_scenes_their_readme_names():
    folder = Path(__file__).resolve().parents[1] / "examples" / "images" / "shapes"
    table = re.findall(r"^\| (\S+\.png) \| (\d+) \| (\d+) \| (\w+) \|$", (folder / "README.md").read_text(), re.M)
    read = {file: (image, mask, row) for file, image, mask, row in scenes.read_folder(folder)}
    assert sorted(read) == sorted(file for file, *_ in table)
    for file, series, index, kind in table:
        item = scene(int(series), int(index), kind)
        image, mask, row = read[file]
        assert np.array_equal(image, item.image) and np.array_equal(mask, item.mask)
        assert row == scenes.labels_row(file.removesuffix(".png"), item)


def test_the_scenes_command_writes_scenes_masks_and_labels_through_the_store(cli, tmp_path):
    result = cli("scenes", "--count", "3", "--seed", "4", "--kind", "bam", "--output-dir", tmp_path)
    assert result.exit_code == 0, result.stderr
    folder = tmp_path / "scenes-bam-s4"
    assert "wrote 3 bam scenes" in result.stderr and str(folder) in result.stderr
    read = list(scenes.read_folder(folder))
    for (_, image, mask, row), item in zip(read, scenes.scenes(4, 3, "bam"), strict=True):
        assert np.array_equal(image, item.image) and np.array_equal(mask, item.mask)
        assert row["class"] == CLASS_NAMES[item.label]
    assert json.loads((folder / "index.json").read_text())["results"]["labels"]["files"]
    assert {path.name for path in tmp_path.iterdir()} == {"scenes-bam-s4"}  # nothing else in the output folder


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--count", "0"], "--count must be between 1 and 1000000 (scenes written in one call), not 0"),
        (["--count", "-3"], "--count must be between 1 and 1000000 (scenes written in one call), not -3"),
        (["--seed", "-1"], "--seed must be between 0 and 9223372036854775807 (a scene series), not -1"),
        (["--kind", "collage"], "--kind 'collage' is not a scene kind: one of single, mosaic, bam"),
    ],
)
def test_the_scenes_command_refuses_bad_counts_seeds_and_kinds_before_drawing(cli, tmp_path, arguments, message):
    result = cli("scenes", *arguments, "--output-dir", tmp_path)
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: {message}"
    assert list(tmp_path.iterdir()) == []
