"""`vitcli bench`: per-image scores against masks, the leaderboard over images (mean and bootstrap interval) as the
job's result about the set, shards merged, a method that cannot run, and refused inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vitcli.loading

CHEAP = ["-M", "gradcam", "-M", "attention", "-M", "random", "-M", "edge", "--scores", "pointing,mass,deletion"]
CHEAP += ["--steps", "2", "--weights", "random"]


def images_with_masks(folder: Path, count: int, size: tuple[int, int] = (64, 48)) -> tuple[Path, Path]:
    """`count` noise images im0.png.. of `size` (width, height) and, in folder/masks, a rectangle mask of each."""
    images, masks = folder / "images", folder / "masks"
    images.mkdir(parents=True)
    masks.mkdir()
    width, height = size
    for index in range(count):
        pixels = np.random.default_rng(index).integers(0, 256, (height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(images / f"im{index}.png")
        mask = np.zeros((height, width), dtype=np.uint8)
        mask[height // 4 : height // 4 + 8 * (index + 1), width // 3 :] = 255
        Image.fromarray(mask).save(masks / f"im{index}.png")
    return images, masks


def leaderboard(root: Path, images: int | None = None) -> list[dict]:
    """The leaderboard over `images` images (a sharded folder also holds each shard's own), or the only one."""
    documents = [json.loads(path.read_text())["result"] for path in root.glob("*/set-*/bench-*-across-images.json")]
    (document,) = [document for document in documents if images in (None, document["images"])]
    return document["leaderboard"]


def image_documents(root: Path) -> list[dict]:
    paths = [path for path in root.glob("*/im*/bench-*.json")]
    return [json.loads(path.read_text())["result"] for path in sorted(paths)]


def test_the_leaderboard_is_the_mean_of_the_images_scores_with_an_interval_around_it(cli, workdir):
    images, masks = images_with_masks(workdir / "data", 3)
    result = cli("bench", images, "--masks", masks, *CHEAP)
    assert result.exit_code == 0, result.stderr
    documents = image_documents(workdir / "outputs" / "bench")
    assert len(documents) == 3
    rows = [row for row in leaderboard(workdir / "outputs" / "bench") if row["score"]]
    assert {row["score"] for row in rows} == {
        "pointing_game",
        "relevance_mass",
        "relevance_mass_signed",
        "deletion_auc",
    }
    assert {row["method"] for row in rows} == {"gradcam", "attention", "random", "edge"}
    for row in rows:
        values = [document["bench"]["scores"][row["method"]][row["score"]] for document in documents]
        assert row["images"] == 3
        assert row["mean"] == pytest.approx(np.mean(values), abs=1e-12)
        assert row["low"] <= row["mean"] <= row["high"]
        assert min(values) - 1e-12 <= row["low"] and row["high"] <= max(values) + 1e-12
    # Ranks follow the means: the best mean of each score ranks 1.
    for score in {row["score"] for row in rows}:
        mine = [row for row in rows if row["score"] == score]
        best = max(mine, key=lambda row: row["mean"] * (1 if row["better"].startswith("higher") else -1))
        assert best["rank"] == 1
    # The pointing game of one image is whether the largest patch of its stored map lies on the object.
    (document, *_) = documents
    share = np.array(document["audits"]["localisation"]["object_share"])
    for item in document["audits"]["localisation"]["methods"]:
        top = int(item["top_patch"][1:]) - 1
        assert document["bench"]["scores"][item["method"]]["pointing_game"] == float(share.reshape(-1)[top] >= 0.5)
    assert "bench leaderboard over 3 images" in result.stdout
    # The report shows the leaderboard as a table, with its figure.
    assert cli("report", workdir / "outputs" / "bench").exit_code == 0
    page = (workdir / "outputs" / "bench" / "report.html").read_text()
    assert "bench leaderboard: mean and 95% bootstrap interval per method and score" in page
    assert "-across-images.png" in page and "<td>relevance_mass_signed</td>" in page


@pytest.mark.slow  # three runs of three images: about 20 s
def test_shards_merged_give_the_leaderboard_of_one_run(cli, workdir):
    images, masks = images_with_masks(workdir / "data", 3)
    assert cli("bench", images, "--masks", masks, *CHEAP, "-o", "fresh").exit_code == 0
    for index in (1, 2):
        sharded = cli("bench", images, "--masks", masks, *CHEAP, "-o", "sharded", "--shard", f"{index}/2")
        assert sharded.exit_code == 0, sharded.stderr
    merged = cli("merge", workdir / "sharded" / "bench")
    assert merged.exit_code == 0, merged.stderr
    assert leaderboard(workdir / "sharded" / "bench", 3) == leaderboard(workdir / "fresh" / "bench")
    # Resumed: nothing is computed again, and the leaderboard stays.
    again = cli("bench", images, "--masks", masks, *CHEAP, "-o", "fresh")
    assert "skipped 3 results already complete" in again.stderr
    assert leaderboard(workdir / "fresh" / "bench")[0]["images"] == 3


@pytest.mark.slow  # a model without a class token (vit_medium_patch16_gap_256, random weights): about 10 s
def test_a_method_that_cannot_run_on_the_model_gets_a_row_saying_why(cli, workdir):
    images, masks = images_with_masks(workdir / "data", 2)
    options = ["-M", "attention", "-M", "edge", "--scores", "pointing", "--weights", "random"]
    result = cli("bench", images, "--masks", masks, *options, "--model", "vit_medium_patch16_gap_256")
    assert result.exit_code == 0, result.stderr
    rows = leaderboard(workdir / "outputs" / "bench")
    (refused,) = [row for row in rows if row["method"] == "attention"]
    assert refused["score"] == "" and "no class token" in refused["reason"]
    assert [row["method"] for row in rows if row["score"]] == ["edge"]
    assert "not run:" in result.stdout and "no class token" in result.stdout


def test_missing_and_wrongly_sized_masks_are_named_in_one_warning_and_the_rest_scored(cli, workdir):
    images, masks = images_with_masks(workdir / "data", 4)
    (masks / "im1.png").unlink()
    Image.new("L", (10, 10)).save(masks / "im2.png")
    options = ["-M", "random", "-M", "edge", "--scores", "pointing,mass", "--weights", "random"]
    result = cli("bench", images, "--masks", masks, *options)
    assert result.exit_code == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "left out" in line]
    assert len(warnings) == 1
    (line,) = warnings
    assert "left out 2 of 4 images" in line and "no mask for im1.png" in line
    assert "im2.png (image 64x48, mask 10x10)" in line
    assert {row["images"] for row in leaderboard(workdir / "outputs" / "bench") if row["score"]} == {2}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--scenes", "0"], "--scenes must be between 1 and 100000 (scenes to generate), not 0"),
        (["--mosaics", "-2"], "--mosaics must be between 1 and 100000 (scenes to generate), not -2"),
        (["--scenes", "3", "--scene-seed", "-1"], "--scene-seed must be 0 or more, not -1"),
        (["--scenes", "3", "--scores", "pointing,colour"], "--scores 'colour': choose from pointing, mass, focus"),
        ([], "nothing to grade: give IMAGES with --masks DIR, or --scenes N"),
    ],
)
def test_bad_scene_counts_and_seeds_are_refused_before_the_model_loads(cli, workdir, monkeypatch, arguments, message):
    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    result = cli("bench", *arguments, "--weights", "random")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {message}"), result.stderr
    assert not (workdir / "outputs" / "bench").exists()


def test_images_without_masks_need_masks_for_the_mask_scores(cli, workdir, monkeypatch):
    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    images, _ = images_with_masks(workdir / "data", 1)
    result = cli("bench", images, "--weights", "random")
    assert result.exit_code == 2
    assert "--scores pointing,mass grade the maps against masks: give --masks DIR" in result.stderr


@pytest.mark.slow  # scenes generated and graded: about 15 s
def test_generated_scenes_are_graded_against_their_own_masks_and_mosaics_get_focus(cli, workdir):
    options = ["-M", "random", "-M", "edge", "--scores", "pointing,focus", "--weights", "random"]
    result = cli("bench", "--scenes", "2", "--mosaics", "1", "--scene-seed", "3", *options)
    assert result.exit_code == 0, result.stderr
    root = workdir / "outputs" / "bench"
    assert sorted(path.name for path in (root / "scenes-s3-n2-m1").glob("*.png")) == [
        "mosaic-00000.png",
        "single-00000.png",
        "single-00001.png",
    ]
    documents = {
        json.loads(path.read_text())["subject"]["path"].rsplit("/", 1)[-1]: json.loads(path.read_text())["result"]
        for path in root.glob("*/*-*/bench-*.json")
        if "across" not in path.name
    }
    mosaic = documents["mosaic-00000.png"]
    assert mosaic["bench"]["scene"]["kind"] == "mosaic"
    assert 0 <= mosaic["bench"]["scores"]["edge"]["focus"] <= 1
    assert "focus" not in documents["single-00000.png"]["bench"]["scores"]["edge"]
    # The scene's true class is the class explained.
    assert mosaic["target"]["class_index"] == mosaic["bench"]["scene"]["label"]


BENCH_CONFIG = """
images = ["data/images"]
[model]
weights = "random"
[[experiments]]
command = "bench"
masks = "data/masks"
method = ["gradcam", "edge"]
scores = "pointing,mass"
"""


@pytest.mark.slow  # a `vitcli run` of two images: about 10 s
def test_a_config_runs_bench_with_its_leaderboard(cli, workdir):
    images_with_masks(workdir / "data", 2)
    (workdir / "bench.toml").write_text(BENCH_CONFIG)
    result = cli("run", workdir / "bench.toml")
    assert result.exit_code == 0, result.stderr
    rows = leaderboard(workdir / "outputs" / "bench")
    assert {(row["method"], row["score"]) for row in rows} >= {("gradcam", "pointing_game"), ("edge", "relevance_mass")}


@pytest.mark.parametrize(("key", "option"), [("scenes = 3", "--scenes"), ("force = true", "--force")])
def test_a_config_cannot_generate_scenes(cli, workdir, monkeypatch, key, option):
    """The command's own options (its scenes, its reruns) are declared with the rest, so a config knows them, and
    refuses them by name: a config's bench grades the run's images."""
    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    images_with_masks(workdir / "data", 2)
    (workdir / "bench.toml").write_text(BENCH_CONFIG + key + "\n")
    result = cli("run", workdir / "bench.toml")
    assert result.exit_code == 2
    where = option.removeprefix("--")
    assert result.stderr.startswith(f"error: experiments[0].{where}: {option} belongs to `vitcli bench`"), result.stderr
    assert "grades the run's images against `masks`" in result.stderr


@pytest.mark.slow  # 80 scenes, the random baseline only: about 40 s
def test_the_random_baselines_pointing_game_is_the_objects_share_of_the_patches(cli, workdir):
    """A uniform random map points at a uniformly random patch: its expected pointing game on an image is the share of
    patches that count as on the object; the mean of those shares lies within the random method's interval."""
    options = ["-M", "random", "--scores", "pointing", "--weights", "random", "--no-figures"]
    # 80 scenes: with objects on about a tenth of the patches, 30 scenes can miss every time (p ~ 0.07), which leaves
    # the interval at [0, 0]
    assert cli("bench", "--scenes", "80", "--scene-seed", "5", *options).exit_code == 0
    root = workdir / "outputs" / "bench"
    documents = [
        json.loads(path.read_text())["result"]
        for path in root.glob("*/single-*/bench-*.json")
        if "across" not in path.name
    ]
    assert len(documents) == 80
    expected = np.mean([np.mean(np.array(d["audits"]["localisation"]["object_share"]) >= 0.5) for d in documents])
    (row,) = [row for row in leaderboard(root) if row["score"] == "pointing_game"]
    assert row["low"] <= expected <= row["high"]
