"""--masks: the pointing game and relevance mass accuracy on synthetic masks whose answer is known by construction.

The image is 248x248: the eval transform (resize the short side to 248, centre crop 224) then only crops 12 pixels
from each side, so patch (r, c) covers the original pixels [12 + 16 r, 28 + 16 r) x [12 + 16 c, 28 + 16 c). Broken on
purpose once: counting the trimap's border (3) as object fails the trimap test; a crop offset of 0 fails them all."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image
from test_bad_input import cut_in_half, image_file, png_header_only

from vitcli.experiments.localisation import localise, score_map
from vitcli.presentation.explain_audit import score_ranking

from conftest import RANDOM_CPU

OBJECT_ROWS, OBJECT_COLS = range(2, 5), range(3, 6)  # nine patches: P32-P34, P46-P48, P60-P62


def object_box(scale: int = 1) -> tuple[slice, slice]:
    top, left = 12 + 16 * OBJECT_ROWS.start, 12 + 16 * OBJECT_COLS.start
    bottom, right = 12 + 16 * OBJECT_ROWS.stop, 12 + 16 * OBJECT_COLS.stop
    return slice(top // scale, bottom // scale), slice(left // scale, right // scale)


@pytest.fixture(scope="module")
def square(tmp_path_factory):
    folder = tmp_path_factory.mktemp("square")
    rgb = np.random.default_rng(0).integers(0, 256, (248, 248, 3), dtype=np.uint8)
    path = folder / "images" / "square.png"
    path.parent.mkdir()
    Image.fromarray(rgb).save(path)
    return path


def known_maps() -> list[tuple[str, np.ndarray]]:
    inside = np.zeros((14, 14))
    inside[3, 4] = 5.0  # the largest value, on the object
    inside[0, 0] = -9.0  # negative mass does not count
    half = np.zeros((14, 14))
    half[13, 13] = 2.0  # the largest value, off the object
    half[2, 3] = 1.0
    half[4, 5] = 1.0  # positive mass: 2 off, 2 on
    return [("inside", inside), ("half", half), ("flat", -np.ones((14, 14)))]


def expect_known_answer(result) -> None:
    expected_share = np.zeros((14, 14))
    expected_share[2:5, 3:6] = 1.0
    assert np.array_equal(result.object_share, expected_share)
    inside, half, flat = result.methods
    assert (inside.top_patch, inside.hit, inside.mass_accuracy) == (3 * 14 + 4 + 1, True, 1.0)
    assert (half.top_patch, half.hit, half.mass_accuracy) == (196, False, 0.5)
    assert (flat.top_patch, flat.hit, flat.mass_accuracy) == (1, False, None)  # ties: the lowest patch; no mass


def test_binary_mask_gives_the_known_answer(vit, square, tmp_path):
    mask = np.zeros((248, 248), dtype=np.uint8)
    mask[object_box()] = 255
    Image.fromarray(mask).save(tmp_path / "square.png")
    result = localise(vit, vit.prepare(square), tmp_path, known_maps())
    assert (result.kind, result.resized) == ("binary", False)
    expect_known_answer(result)


def test_trimap_counts_only_its_ones_as_object(vit, square, tmp_path):
    trimap = np.full((248, 248), 2, dtype=np.uint8)
    rows, cols = object_box()
    trimap[rows.start - 8 : rows.stop + 8, cols.start - 8 : cols.stop + 8] = 3  # a border 8 pixels wide
    trimap[rows, cols] = 1
    Image.fromarray(trimap).save(tmp_path / "square.png")
    result = localise(vit, vit.prepare(square), tmp_path, known_maps())
    assert result.kind == "trimap"
    expect_known_answer(result)


def test_a_mask_of_another_size_is_resized_with_nearest_neighbours(vit, square, tmp_path):
    mask = np.zeros((124, 124), dtype=np.uint8)
    mask[object_box(scale=2)] = 1
    Image.fromarray(mask).save(tmp_path / "square.png")
    result = localise(vit, vit.prepare(square), tmp_path, known_maps())
    assert result.resized
    expect_known_answer(result)


def test_half_a_patch_on_the_object_is_a_hit():
    share = np.zeros((2, 2))
    share[0, 1] = 0.5
    values = np.array([[0.0, 1.0], [0.5, 0.0]])
    scored = score_map("m", values, share)
    assert scored.hit and scored.top_patch == 2
    assert scored.mass_accuracy == pytest.approx(0.5 / 1.5)


def test_ranking_over_images_is_mean_sd_and_rank_per_score():
    def body(a_hit, b_hit, a_mass, b_mass):
        methods = [
            {"method": "a", "pointing_game": a_hit, "mass_accuracy": a_mass},
            {"method": "b", "pointing_game": b_hit, "mass_accuracy": b_mass},
        ]
        return {"audits": {"localisation": {"methods": methods}}}

    rows = score_ranking([body(True, True, 0.2, 0.9), body(False, True, 0.4, None)])
    by = {(row["score"], row["method"]): row for row in rows}
    assert by["pointing_game", "b"]["mean"] == 1.0 and by["pointing_game", "b"]["rank"] == 1
    assert by["pointing_game", "a"]["mean"] == 0.5 and by["pointing_game", "a"]["rank"] == 2
    assert by["pointing_game", "a"]["sd"] == pytest.approx(np.std([1, 0], ddof=1))
    assert by["mass_accuracy", "a"]["mean"] == pytest.approx(0.3) and by["mass_accuracy", "a"]["images"] == 2
    assert by["mass_accuracy", "b"]["images"] == 1 and by["mass_accuracy", "b"]["sd"] == 0.0
    assert by["mass_accuracy", "b"]["rank"] == 1
    tied = score_ranking([body(True, True, 0.5, 0.5)])
    assert {row["rank"] for row in tied} == {1}


def test_command_scores_each_image_and_ranks_the_methods_over_the_folder(cli, workdir, square, tmp_path):
    second = square.parent / "second.png"
    Image.open(square).transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(second)
    masks = tmp_path / "masks"
    masks.mkdir()
    for name in ("square", "second"):
        mask = np.zeros((248, 248), dtype=np.uint8)
        mask[object_box()] = 1
        Image.fromarray(mask).save(masks / f"{name}.png")
    result = cli("explain", square.parent, *RANDOM_CPU, "-M", "rollout", "-M", "gradient", "--masks", masks, "-q")
    assert result.exit_code == 0, result.stderr
    documents = [json.loads(path.read_text()) for path in sorted((workdir / "outputs").glob("*/*-*/explain-*.json"))]
    per_image = [document["result"] for document in documents if "images" not in document["experiment"]["settings"]]
    assert len(per_image) == 2
    (across,) = (workdir / "outputs").glob("*/set-*/explain-*-across-images.json")
    ranking = json.loads(across.read_text())["result"]["audit_scores"]
    for row in ranking:
        key = row["score"]
        values = [
            entry[key]
            for body in per_image
            for entry in body["audits"]["localisation"]["methods"]
            if entry["method"] == row["method"]
        ]
        assert row["mean"] == pytest.approx(np.mean([float(value) for value in values]), abs=1e-12)


def test_command_refuses_a_missing_masks_folder(cli, photo, tmp_path):
    result = cli("explain", photo, *RANDOM_CPU, "--masks", tmp_path / "nowhere")
    assert result.exit_code == 2
    assert f"--masks {tmp_path / 'nowhere'} is not a folder" in result.stderr


def test_command_fails_an_image_without_a_mask(cli, photo, tmp_path):
    masks = tmp_path / "masks"
    masks.mkdir()
    result = cli("explain", photo, *RANDOM_CPU, "-M", "rollout", "--masks", masks)
    assert result.exit_code == 1
    assert f"no mask for {photo.name} in {masks}: expected {masks / (photo.stem + '.png')}" in result.stderr


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda path: png_header_only(path, 100_000, 100_000), "is too large to decode safely"),
        (lambda path: path.write_bytes(b"%!PS-Adobe-3.0 EPSF-3.0\n"), "is not an image that Pillow can read as"),
        (lambda path: cut_in_half(image_file(path.parent, path.name, "PNG")), "is damaged or truncated"),
    ],
    ids=["bomb", "eps", "truncated"],
)
def test_a_mask_is_read_as_safely_as_an_image(cli, photo, tmp_path, make, message):
    masks = tmp_path / "masks"
    masks.mkdir()
    make(masks / f"{photo.stem}.png")
    result = cli("explain", photo, *RANDOM_CPU, "-M", "rollout", "--masks", masks)
    assert result.exit_code == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:") or "Traceback" in line]
    assert any(f"{masks / (photo.stem + '.png')} {message}" in line for line in lines), result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
