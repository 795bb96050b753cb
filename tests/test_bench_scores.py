"""The scores and baselines a benchmark of explanations reads: the pointing game, relevance mass accuracy (positive
and signed) and Focus against Quantus 0.6.0 as the oracle, the random and edge baselines, and the bootstrap interval
against scipy.stats.bootstrap.

vitcli scores (rows, cols) patch maps against each patch's object share; Quantus scores pixel maps against pixel masks.
Each patch map is handed to Quantus repeated over its patch's pixels, with the pixel mask the shares came from, and
without Quantus's normalisation or absolute value. The scenes are squares on noise, made here.
Broken on purpose once: the signed mass computed on the clipped map fails the signed test; Focus's quadrant order
swapped (top right for bottom left) fails the Focus test.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from vitcli.experiments.baselines import edge_magnitude, edge_map, random_map
from vitcli.experiments.bootstrap import bootstrap_interval
from vitcli.experiments.localisation import (
    HIT_SHARE,
    focus,
    mass_accuracy,
    mosaic_quadrants,
    pointing_game,
    pointing_game_any_pixel,
    quadrant_share,
    signed_mass_accuracy,
)
from vitcli.grid import PatchGrid

from conftest import RANDOM_CPU

quantus = pytest.importorskip("quantus")

SIZE, PATCH, ROWS = 224, 16, 14
GRID = PatchGrid(SIZE, SIZE, PATCH, ("CLS",))
QUANTUS_OPTIONS = dict(normalise=False, abs=False, disable_warnings=True)
ALL_QUADRANTS = [tuple(int(bit) for bit in f"{code:04b}") for code in range(1, 16)]  # every non-empty target set


def square_mask(rng: np.random.Generator, aligned: bool) -> np.ndarray:
    """(224, 224) bool: one square object, on patch borders or anywhere."""
    if aligned:
        side = int(rng.integers(1, 8)) * PATCH
        top, left = (int(value) * PATCH for value in rng.integers(0, (SIZE - side) // PATCH + 1, 2))
    else:
        side = int(rng.integers(10, 120))
        top, left = (int(value) for value in rng.integers(0, SIZE - side + 1, 2))
    mask = np.zeros((SIZE, SIZE), dtype=bool)
    mask[top : top + side, left : left + side] = True
    return mask


def shares(mask: np.ndarray, patch: int = PATCH) -> np.ndarray:
    rows, cols = mask.shape[0] // patch, mask.shape[1] // patch
    return mask.reshape(rows, patch, cols, patch).mean(axis=(1, 3))


def pixels(values: np.ndarray, patch: int = PATCH) -> np.ndarray:
    """A patch map repeated over each patch's pixels."""
    return np.kron(values, np.ones((patch, patch)))


def quantus_scores(metric, maps: list[np.ndarray], masks: list[np.ndarray] | None = None, **call) -> np.ndarray:
    """Quantus's scores of pixel maps (N, 1, H, W) on a stand-in model (the localisation metrics never run it)."""
    a_batch = np.stack(maps)[:, None]
    x_batch = np.zeros((len(maps), 1, *maps[0].shape), dtype=np.float32)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(maps[0].size, 2))
    s_batch = None if masks is None else np.stack(masks)[:, None].astype(float)
    scores = metric(**QUANTUS_OPTIONS)(
        model=model, x_batch=x_batch, y_batch=np.zeros(len(maps), int), a_batch=a_batch, s_batch=s_batch, **call
    )
    return np.asarray(scores, dtype=float)


# ----- the scores against Quantus


def test_signed_and_positive_mass_accuracy_equal_quantus_on_masks_of_any_placement():
    rng = np.random.default_rng(1)
    masks = [square_mask(rng, aligned=bool(index % 2)) for index in range(40)]
    maps = [rng.normal(0.3, 1.0, (ROWS, ROWS)) for _ in masks]  # signed; sums about 60, far from 0
    signed = quantus_scores(quantus.RelevanceMassAccuracy, [pixels(m) for m in maps], masks)
    positive = quantus_scores(quantus.RelevanceMassAccuracy, [pixels(np.clip(m, 0, None)) for m in maps], masks)
    for values, mask, expected_signed, expected_positive in zip(maps, masks, signed, positive, strict=True):
        assert signed_mass_accuracy(values, shares(mask)) == pytest.approx(expected_signed, abs=1e-6)
        assert mass_accuracy(values, shares(mask)) == pytest.approx(expected_positive, abs=1e-6)
    assert np.abs(signed - positive).max() > 0.05  # negative values make the two differ here


def test_on_maps_without_negative_values_both_masses_equal_quantus():
    rng = np.random.default_rng(2)
    masks = [square_mask(rng, aligned=False) for _ in range(20)]
    maps = [rng.random((ROWS, ROWS)) for _ in masks]
    expected = quantus_scores(quantus.RelevanceMassAccuracy, [pixels(m) for m in maps], masks)
    for values, mask, score in zip(maps, masks, expected, strict=True):
        assert mass_accuracy(values, shares(mask)) == pytest.approx(score, abs=1e-6)
        assert signed_mass_accuracy(values, shares(mask)) == pytest.approx(score, abs=1e-6)


def test_pointing_game_equals_quantus_on_patch_aligned_masks_without_ties():
    rng = np.random.default_rng(3)
    masks = [square_mask(rng, aligned=True) for _ in range(60)]
    maps = [rng.normal(size=(ROWS, ROWS)) for _ in masks]
    for index in range(0, 60, 3):  # a third of the maps peak on the object, so both answers occur
        maps[index][np.unravel_index(np.argmax(shares(masks[index])), (ROWS, ROWS))] = 10.0
    expected = quantus_scores(quantus.PointingGame, [pixels(m) for m in maps], masks)
    ours = [pointing_game(values, shares(mask)) for values, mask in zip(maps, masks, strict=True)]
    assert ours == [bool(score) for score in expected]
    assert 0 < sum(ours) < len(ours)


def test_pointing_game_differs_from_quantus_only_by_the_documented_protocol():
    """Quantus: a hit when any pixel of any tied maximum is on the object. vitcli: the first largest patch, with at
    least HIT_SHARE of its pixels on the object."""
    corner = np.zeros((SIZE, SIZE), dtype=bool)
    corner[:4, :4] = True  # 1/16 of patch P1 on the object
    peak = np.zeros((ROWS, ROWS))
    peak[0, 0] = 1.0
    tied = np.zeros((ROWS, ROWS))
    tied[0, 1] = tied[0, 0] = 1.0  # P1 and P2 tie; only P2 lies on the object below
    second = np.zeros((SIZE, SIZE), dtype=bool)
    second[:PATCH, PATCH : 2 * PATCH] = True
    expected = quantus_scores(quantus.PointingGame, [pixels(peak), pixels(tied)], [corner, second])
    assert list(expected) == [1.0, 1.0]
    assert shares(corner)[0, 0] < HIT_SHARE and not pointing_game(peak, shares(corner))
    assert not pointing_game(tied, shares(second))  # the tie goes to P1, off the object
    assert pointing_game_any_pixel(peak, shares(corner)) and pointing_game_any_pixel(tied, shares(second))


def test_pointing_game_any_pixel_equals_quantus_on_any_mask_with_ties():
    rng = np.random.default_rng(16)
    masks = [square_mask(rng, aligned=False) for _ in range(60)]
    maps = [rng.integers(0, 4, (ROWS, ROWS)).astype(float) for _ in masks]  # many tied maxima
    expected = quantus_scores(quantus.PointingGame, [pixels(m) for m in maps], masks)
    ours = [pointing_game_any_pixel(values, shares(mask)) for values, mask in zip(maps, masks, strict=True)]
    assert ours == [bool(score) for score in expected]
    assert 0 < sum(ours) < len(ours)


@pytest.mark.parametrize(("rows", "patch"), [(14, 16), (7, 32)], ids=["14x14", "7x7-straddling"])
def test_focus_equals_quantus_for_every_set_of_target_quadrants(rows, patch):
    rng = np.random.default_rng(4)
    maps = [rng.normal(0.2, 1.0, (rows, rows)) for _ in ALL_QUADRANTS]
    expected = quantus_scores(
        quantus.Focus, [pixels(m, patch) for m in maps], custom_batch=[list(flags) for flags in ALL_QUADRANTS]
    )
    for values, flags, score in zip(maps, ALL_QUADRANTS, expected, strict=True):
        assert focus(values, flags, patch) == pytest.approx(score, abs=1e-6)


def test_focus_is_positive_mass_accuracy_against_the_target_quadrants():
    values = np.random.default_rng(5).normal(size=(ROWS, ROWS))
    quadrants = (0, 1, 1, 0)
    mask = np.zeros((SIZE, SIZE), dtype=bool)
    mask[:112, 112:] = mask[112:, :112] = True
    assert np.array_equal(quadrant_share(ROWS, ROWS, PATCH, quadrants), shares(mask))
    assert focus(values, quadrants) == mass_accuracy(values, shares(mask))
    assert mosaic_quadrants(mask) == quadrants


def test_only_masks_of_one_to_three_whole_quadrants_are_mosaics():
    mask = np.zeros((10, 12), dtype=bool)
    assert mosaic_quadrants(mask) is None  # nothing
    mask[:5, :6] = True
    assert mosaic_quadrants(mask) == (1, 0, 0, 0)
    mask[5, 0] = True  # one pixel over the border
    assert mosaic_quadrants(mask) is None
    assert mosaic_quadrants(np.ones((10, 12), dtype=bool)) is None  # all four: no target to find


def test_an_oracle_map_scores_one_on_every_score():
    rng = np.random.default_rng(6)
    for aligned in (True, False):
        for _ in range(10):
            share = shares(square_mask(rng, aligned))
            oracle = (share >= 1).astype(float) if not aligned else share  # the mask itself, at patch level
            if not oracle.any():
                continue
            assert pointing_game(oracle, share)
            assert mass_accuracy(oracle, share) == 1.0 and signed_mass_accuracy(oracle, share) == 1.0
    for flags in ALL_QUADRANTS:
        assert focus(quadrant_share(ROWS, ROWS, PATCH, flags), flags) == 1.0


def test_maps_without_mass_have_no_mass_scores():
    share = shares(square_mask(np.random.default_rng(7), aligned=True))
    assert mass_accuracy(-np.ones((ROWS, ROWS)), share) is None
    balanced = np.zeros((ROWS, ROWS))
    balanced[0, 0], balanced[5, 5] = 1.0, -1.0
    assert signed_mass_accuracy(balanced, share) is None
    assert focus(np.zeros((ROWS, ROWS)), (1, 0, 0, 0)) is None


# ----- the baselines


def scene(rng: np.random.Generator) -> tuple[torch.Tensor, np.ndarray]:
    """A noise image with a brighter square object on patch borders: (3, 224, 224) input and its mask."""
    mask = square_mask(rng, aligned=True)
    image = rng.random((3, SIZE, SIZE)) * 0.5 + 0.5 * mask
    return torch.from_numpy(image.astype(np.float32)), mask


def test_random_baselines_pointing_game_is_the_share_of_object_patches():
    rng = np.random.default_rng(8)
    hits, chance = [], []
    for _ in range(400):
        image, mask = scene(rng)
        share = shares(mask)
        hits.append(float(pointing_game(random_map(image, ROWS, ROWS, seed=0), share)))
        chance.append(float((share >= HIT_SHARE).mean()))
    interval = bootstrap_interval(hits, seed=0)
    assert interval.low <= np.mean(chance) <= interval.high
    assert interval.high - interval.low < 0.1  # the interval is narrow enough to mean something


def test_random_map_is_seeded_by_the_seed_and_the_input():
    rng = np.random.default_rng(9)
    image, _ = scene(rng)
    first = random_map(image, ROWS, ROWS, seed=3)
    assert first.shape == (ROWS, ROWS) and 0 <= first.min() and first.max() < 1
    assert np.array_equal(first, random_map(image.clone(), ROWS, ROWS, seed=3))
    assert not np.array_equal(first, random_map(image, ROWS, ROWS, seed=4))
    moved = image.clone()
    moved[0, 0, 0] += 1e-3
    assert not np.array_equal(first, random_map(moved, ROWS, ROWS, seed=3))


def test_edge_magnitude_equals_scikit_images_sobel():
    """skimage.filters.sobel: sqrt((Gx^2 + Gy^2) / 2) with kernels divided by 4, borders mirrored as here."""
    filters = pytest.importorskip("skimage.filters")
    gray = np.random.default_rng(10).random((SIZE, SIZE))
    ours = edge_magnitude(np.stack([gray] * 3))  # equal channels: the luma is the channel (weights sum to 1)
    assert ours == pytest.approx(filters.sobel(gray) * 4 * np.sqrt(2), abs=1e-9)


def test_edge_map_lights_the_patches_on_the_squares_border():
    rgb = np.zeros((3, SIZE, SIZE))
    rgb[:, 40:104, 56:136] = 1.0  # a white rectangle inside patches rows 2..6, cols 3..8, borders mid-patch
    values = edge_map(rgb, GRID)
    border = np.zeros((ROWS, ROWS), dtype=bool)
    border[2:7, 3:9] = True
    border[3:6, 4:8] = False  # whole patches inside the rectangle see no edge
    assert np.array_equal(values > 0, border)
    assert np.array_equal(edge_map(np.full((3, SIZE, SIZE), 0.3), GRID), np.zeros((ROWS, ROWS)))


# ----- the bootstrap interval


def test_bootstrap_interval_equals_scipys_percentile_bootstrap_on_the_same_draws():
    from scipy import stats

    scores = np.random.default_rng(11).random(37)
    ours = bootstrap_interval(list(scores), resamples=1000, seed=12)
    theirs = stats.bootstrap(
        (scores,), np.mean, n_resamples=1000, method="percentile", confidence_level=0.95, rng=np.random.default_rng(12)
    ).confidence_interval
    assert (ours.low, ours.high) == pytest.approx((theirs.low, theirs.high), abs=1e-12)
    assert ours.mean == pytest.approx(scores.mean(), abs=1e-15) and ours.n == 37


def test_bootstrap_interval_leaves_absent_scores_out():
    interval = bootstrap_interval([0.5, None, float("nan")], seed=0)
    assert (interval.mean, interval.low, interval.high, interval.n, interval.absent) == (0.5, 0.5, 0.5, 1, 2)
    assert bootstrap_interval([None]) is None


# ----- through explain


@pytest.mark.slow
def test_explain_scores_the_baselines_and_focus_on_a_mosaic(cli, workdir, tmp_path):
    """A 2x2 mosaic photo 248x248 (the crop keeps its centre), its mask the top-right and bottom-left quadrants."""
    images, masks = tmp_path / "images", tmp_path / "masks"
    images.mkdir(), masks.mkdir()
    rgb = np.random.default_rng(13).integers(0, 256, (248, 248, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(images / "mosaic.png")
    mask = np.zeros((248, 248), dtype=np.uint8)
    mask[:124, 124:] = mask[124:, :124] = 255
    Image.fromarray(mask).save(masks / "mosaic.png")
    result = cli(
        "explain",
        images / "mosaic.png",
        *RANDOM_CPU,
        "-M",
        "random",
        "-M",
        "edge",
        "-M",
        "gradient",
        "--masks",
        masks,
        "-f",
        "json",
    )
    assert result.exit_code == 0, result.stderr
    ((document,),) = json.loads(result.stdout).values()
    body = document["result"]
    localisation = body["audits"]["localisation"]
    assert localisation["quadrants"] == ["top right", "bottom left"]
    assert "focus" in localisation["definition"]
    maps = {item["method"]: np.array(item["values"]) for item in body["maps"]}
    assert [entry["method"] for entry in localisation["methods"]] == ["random", "edge", "gradient"]
    for entry in localisation["methods"]:
        values = maps[entry["method"]]
        assert entry["focus"] == pytest.approx(focus(values, (0, 1, 1, 0)), abs=1e-12)
        assert entry["mass_accuracy_signed"] == pytest.approx(
            signed_mass_accuracy(values, np.array(localisation["object_share"])), abs=1e-12
        )


@pytest.mark.slow
def test_the_baselines_run_through_every_audit(tiny2, photo, tmp_path):
    """Faithfulness beside its random patch orders, masks, robustness, ROAD and sanity; the baselines read no model,
    so the sanity checks see the same maps at every step."""
    from vitcli.experiments.explain import MapSettings, explain
    from vitcli.experiments.explain_audits import audit
    from vitcli.experiments.explain_options import AuditOptions
    from vitcli.experiments.faithfulness import RANDOM, FaithfulnessOptions

    prepared = tiny2.prepare(photo)
    mask = np.zeros((64, 64), dtype=np.uint8)
    mask[16:48, 16:48] = 1
    Image.fromarray(mask * 255).save(tmp_path / f"{photo.stem}.png")
    methods = ["random", "edge", "gradient"]
    result = explain(tiny2, prepared, methods, target="3", faithfulness=FaithfulnessOptions(2, random_orders=2))
    assert {method for method, _, _ in result.faithfulness.ranking()} == {*methods, RANDOM}
    options = AuditOptions(masks=tmp_path, robustness=True, road=True, sanity=True)
    audits = audit(tiny2, prepared, result, MapSettings(result.block), options)
    assert [item.method for item in audits.localisation.methods] == methods
    assert [item.method for item in audits.road.methods] == methods
    sensitivity = {item.method: item.max for item in audits.robustness.methods}
    assert sensitivity["edge"] < 0.1 < sensitivity["random"]  # a fresh draw for each perturbed input
    for step in audits.sanity.steps:
        for method in ("random", "edge"):
            assert step.similarity[method].spearman_abs == 1.0
    assert not audits.sanity.passed("random") and not audits.sanity.passed("edge")


def test_the_scores_reach_the_table_json_and_summary_named():
    from pathlib import Path
    from types import SimpleNamespace

    from rich.console import Console

    from vitcli.experiments.localisation import Localisation, score_map
    from vitcli.presentation.explain_audit import audit_scores, audits_json, localisation_table

    share = shares(square_mask(np.random.default_rng(14), aligned=True))
    values = np.random.default_rng(15).normal(0.3, 1.0, (ROWS, ROWS))
    for quadrants in (None, (1, 0, 0, 1)):
        localisation = Localisation(Path("m.png"), "binary", False, share, [score_map("ig", values, share, quadrants)])
        localisation.quadrants = quadrants
        empty = dict(robustness=None, road=None, sanity=None)
        body = audits_json(SimpleNamespace(audits=SimpleNamespace(localisation=localisation, **empty)))
        scores = audit_scores({"audits": body})
        assert scores["mass_accuracy"]["ig"] == mass_accuracy(values, share)
        assert scores["mass_accuracy_signed"]["ig"] == signed_mass_accuracy(values, share)
        assert ("focus" in scores) == (quadrants is not None)
        console = Console(width=200, record=True)
        console.print(localisation_table(localisation))
        shown = console.export_text()
        assert "mass accuracy signed" in shown and ("Focus" in shown) == (quadrants is not None)
    assert scores["focus"]["ig"] == focus(values, (1, 0, 0, 1))


def test_the_random_baselines_seed_names_its_results_and_the_edge_map_needs_none():
    from vitcli.jobs.explain import explain_jobs

    def name(method: str, seed: int, **audits) -> str:
        return explain_jobs(method=[method], noise_seed=seed, **audits)[0].name()

    assert name("random", 0) != name("random", 5) and name("random", 5).endswith("-ns5")
    assert name("random", 5, road=True).count("ns5") == 1  # the audits' part carries it once
    assert name("edge", 0) == name("edge", 5)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (dict(resamples=0), "bootstrap resamples must be at least 1, not 0"),
        (dict(confidence=1.0), "bootstrap confidence must be between 0 and 1, not 1.0"),
        (dict(seed=-1), "bootstrap seed must be at least 0, not -1"),
    ],
)
def test_bootstrap_interval_refuses_settings_out_of_range(arguments, message):
    from vitcli.errors import UsageError

    with pytest.raises(UsageError) as refused:
        bootstrap_interval([0.5, 0.7], **arguments)
    assert str(refused.value) == message


def test_quadrant_flags_are_checked():
    from vitcli.errors import VitcliError

    for flags in [(0, 0, 0, 0), (1, 0, 0), (2, 0, 0, 0)]:
        with pytest.raises(VitcliError, match="target quadrants must be four 0/1 flags"):
            focus(np.ones((ROWS, ROWS)), flags)
