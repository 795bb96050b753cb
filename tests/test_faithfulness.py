"""Deletion and insertion curves: endpoints, hand-covered copies, occlusion's own drop map, AUCs, random baseline."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vitcli.errors import UsageError
from vitcli.experiments.explain import explain
from vitcli.experiments.faithfulness import (
    RANDOM,
    FaithfulnessOptions,
    count_forwards,
    faithfulness,
    faithfulness_spread,
    step_counts,
    trapezoid_auc,
)
from vitcli.model import VitModel
from vitcli.presentation import explain as presentation

# Batched and one-at-a-time float32 forwards differ by rounding only (about 1e-7 in probability).
PROBABILITY_TOLERANCE = 1e-6


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def prepared(tiny2, photo):
    return tiny2.prepare(photo)


def gray(model: VitModel, image: torch.Tensor) -> torch.Tensor:
    """The gray fill written out: the checkpoint's mean pixel, normalized, is 0 everywhere."""
    mean = torch.tensor(model.mean).reshape(3, 1, 1)
    return ((mean - mean) / torch.tensor(model.std).reshape(3, 1, 1)).expand_as(image).clone()


def own_probability(model: VitModel, image: torch.Tensor, target: int) -> float:
    with torch.inference_mode():
        return float(model.net(image[None]).softmax(dim=-1)[0, target])


def covered_by_hand(model: VitModel, image: torch.Tensor, fill: torch.Tensor, patches: list[int]) -> torch.Tensor:
    copy = image.clone()
    for patch in patches:
        left, top, right, bottom = model.grid.pixel_box(patch)
        copy[:, top:bottom, left:right] = fill[:, top:bottom, left:right]
    return copy


# ----- AUC and steps


def test_trapezoid_auc_on_hand_made_curves():
    # Two trapezoids: 0.25 * (0.8 + 0.4) / 2 + 0.75 * (0.4 + 0.2) / 2 = 0.15 + 0.225.
    assert trapezoid_auc([0.0, 0.25, 1.0], [0.8, 0.4, 0.2]) == pytest.approx(0.375, abs=1e-15)
    assert trapezoid_auc([0.0, 1.0], [0.3, 0.3]) == pytest.approx(0.3, abs=1e-15)
    assert trapezoid_auc([0.0, 0.5, 1.0], [1.0, 0.0, 1.0]) == pytest.approx(0.5, abs=1e-15)


def test_step_counts_cover_zero_to_all():
    assert step_counts(16, 16) == list(range(17))
    assert step_counts(196, 4) == [0, 49, 98, 147, 196]
    assert step_counts(196, 3) == [0, 65, 130, 196]


# ----- the curves against hand-covered copies


def test_curves_against_hand_covered_copies(tiny2, prepared):
    grid = tiny2.grid
    image = prepared.input
    fill = gray(tiny2, image)
    generator = np.random.default_rng(0)
    values = generator.normal(size=(grid.rows, grid.cols))
    values[0, 1] = values[0, 2]  # a tie: the lower patch number (P2) must come first
    target = 7
    steps = 5
    result = faithfulness(tiny2, image, fill, {"map": values}, target, FaithfulnessOptions(steps, random_orders=0))
    curves = result.methods[0]
    order = sorted(range(1, grid.num_patches + 1), key=lambda patch: (-values.reshape(-1)[patch - 1], patch))
    assert curves.order == order
    counts = step_counts(grid.num_patches, steps)
    assert np.array_equal(curves.deletion.fractions, np.array(counts) / grid.num_patches)
    clean = own_probability(tiny2, image, target)
    covered = own_probability(tiny2, fill, target)
    assert curves.deletion.probabilities[0] == pytest.approx(clean, abs=PROBABILITY_TOLERANCE)
    assert curves.insertion.probabilities[-1] == pytest.approx(clean, abs=PROBABILITY_TOLERANCE)
    assert curves.deletion.probabilities[-1] == pytest.approx(covered, abs=PROBABILITY_TOLERANCE)
    assert curves.insertion.probabilities[0] == pytest.approx(covered, abs=PROBABILITY_TOLERANCE)
    everything = list(range(1, grid.num_patches + 1))
    for step, count in enumerate(counts):
        deleted = covered_by_hand(tiny2, image, fill, order[:count])
        inserted = covered_by_hand(tiny2, image, fill, [patch for patch in everything if patch not in order[:count]])
        deletion = own_probability(tiny2, deleted, target)
        insertion = own_probability(tiny2, inserted, target)
        assert curves.deletion.probabilities[step] == pytest.approx(deletion, abs=PROBABILITY_TOLERANCE)
        assert curves.insertion.probabilities[step] == pytest.approx(insertion, abs=PROBABILITY_TOLERANCE)
    assert curves.deletion.auc == pytest.approx(
        trapezoid_auc(curves.deletion.fractions, curves.deletion.probabilities), abs=1e-15
    )


def test_first_point_is_the_clean_probability_through_explain(vit, photo):
    """On the default architecture: explain's curves start from the probability the model gives the clean image."""
    prepared = vit.prepare(photo)
    result = explain(vit, prepared, ["gradcam"], faithfulness=FaithfulnessOptions(2, random_orders=1))
    clean = own_probability(vit, prepared.input, result.target.index)
    curves = result.faithfulness
    assert curves.clean_probability == pytest.approx(clean, abs=PROBABILITY_TOLERANCE)
    assert curves.methods[0].deletion.probabilities[0] == curves.clean_probability
    assert curves.random.deletion.probabilities[0] == curves.clean_probability
    assert result.target.probability == pytest.approx(clean, abs=PROBABILITY_TOLERANCE)


def test_deletion_with_occlusions_own_map_drops_by_its_largest_drop(tiny2, prepared):
    """One patch per step: the first deletion step covers the patch whose cover dropped the probability most."""
    steps = tiny2.grid.num_patches
    result = explain(tiny2, prepared, ["occlusion"], faithfulness=FaithfulnessOptions(steps, random_orders=0))
    drops = result.maps[0].values
    curves = result.faithfulness.methods[0]
    first_step = curves.deletion.probabilities[0] - curves.deletion.probabilities[1]
    assert 100 * first_step == pytest.approx(drops.max(), abs=100 * PROBABILITY_TOLERANCE)
    row, col = np.unravel_index(drops.argmax(), drops.shape)
    assert curves.order[0] == tiny2.grid.patch_at(row, col)


# ----- the random baseline


def test_random_baseline_is_the_mean_of_its_seeded_orders(tiny2, prepared):
    grid = tiny2.grid
    image = prepared.input
    fill = gray(tiny2, image)
    options = FaithfulnessOptions(4, random_orders=3, seed=11)
    result = faithfulness(tiny2, image, fill, {}, 2, options)
    # The same orders drawn here and given as maps whose values fall along each order.
    generator = torch.Generator().manual_seed(11)
    maps = {}
    for index in range(3):
        order = torch.randperm(grid.num_patches, generator=generator)
        values = torch.empty(grid.num_patches, dtype=torch.float64)
        values[order] = -torch.arange(grid.num_patches, dtype=torch.float64)
        maps[f"order {index}"] = values.reshape(grid.rows, grid.cols).numpy()
    as_maps = faithfulness(tiny2, image, fill, maps, 2, FaithfulnessOptions(4, random_orders=0))
    deletions = np.stack([curves.deletion.probabilities for curves in as_maps.methods])
    insertions = np.stack([curves.insertion.probabilities for curves in as_maps.methods])
    random = result.random
    assert np.allclose(random.deletion.probabilities, deletions.mean(axis=0), atol=PROBABILITY_TOLERANCE)
    assert np.allclose(random.insertion.probabilities, insertions.mean(axis=0), atol=PROBABILITY_TOLERANCE)
    assert np.allclose(random.deletion_spread, deletions.std(axis=0), atol=PROBABILITY_TOLERANCE)
    assert random.deletion.auc == pytest.approx(np.mean([c.deletion.auc for c in as_maps.methods]), abs=1e-9)
    again = faithfulness(tiny2, image, fill, {}, 2, options)
    assert np.array_equal(again.random.deletion_aucs, random.deletion_aucs)
    other = faithfulness(tiny2, image, fill, {}, 2, FaithfulnessOptions(4, random_orders=3, seed=12))
    assert not np.array_equal(other.random.deletion_aucs, random.deletion_aucs)


# ----- bookkeeping


def test_progress_counts_every_forward(tiny2, prepared):
    reported = []
    options = FaithfulnessOptions(3, random_orders=2)
    values = np.arange(tiny2.grid.num_patches, dtype=float).reshape(tiny2.grid.rows, tiny2.grid.cols)
    faithfulness(
        tiny2, prepared.input, gray(tiny2, prepared.input), {"a": values, "b": -values}, 0, options, reported.append
    )
    assert sum(reported) == count_forwards(2, options) == 2 + 2 * 4 * 2
    assert max(reported) <= tiny2.batch_size


def test_options_are_checked(tiny2, prepared):
    fill = gray(tiny2, prepared.input)
    with pytest.raises(UsageError, match="--steps must be between 1 and 16"):
        faithfulness(tiny2, prepared.input, fill, {}, 0, FaithfulnessOptions(17))
    with pytest.raises(UsageError, match="--random-orders"):
        faithfulness(tiny2, prepared.input, fill, {}, 0, FaithfulnessOptions(4, random_orders=-1))


def test_ranking_and_spread_over_images(tiny2, prepared, photo):
    options = FaithfulnessOptions(4, random_orders=2)
    results = [
        explain(tiny2, prepared, ["gradcam", "relevance"], faithfulness=options).faithfulness,
        explain(tiny2, prepared, ["gradcam", "relevance"], target="5", faithfulness=options).faithfulness,
    ]
    ranking = results[0].ranking()
    assert sorted(rank for _, rank, _ in ranking) == [1, 2, 3]
    aucs = {curves.method: curves.deletion.auc for curves in results[0].methods}
    aucs[RANDOM] = results[0].random.deletion.auc
    best = min(aucs, key=aucs.get)
    assert dict((method, rank) for method, rank, _ in ranking)[best] == 1
    spreads = {spread.method: spread for spread in faithfulness_spread(results)}
    assert set(spreads) == {"gradcam", "relevance", RANDOM}
    insertion = [next(c for c in result.methods if c.method == "relevance").insertion.auc for result in results]
    assert spreads["relevance"].insertion_mean == pytest.approx(np.mean(insertion), abs=1e-15)
    assert spreads["relevance"].insertion_std == pytest.approx(np.std(insertion, ddof=1), abs=1e-15)


def test_presentation_of_the_curves(tiny2, prepared):
    result = explain(tiny2, prepared, ["gradcam", "attention"], faithfulness=FaithfulnessOptions(4, random_orders=2))
    rows = presentation.curve_rows(result)
    assert len(rows) == 3 * 2 * 5  # (2 maps + random) x (deletion, insertion) x (steps + 1)
    assert rows[0]["fraction"] == 0 and rows[0]["probability"] == result.faithfulness.clean_probability
    document = json.loads(json.dumps(presentation.document(result)))
    assert "trapezoidal" in document["faithfulness"]["definition"]
    assert len(document["faithfulness"]["random"]["deletion_aucs"]) == 2
    summary = presentation.summary(result)
    assert summary["explain_random_orders_deletion_auc"] == result.faithfulness.random.deletion.auc
    assert summary["explain_gradcam_insertion_auc"] == result.faithfulness.methods[0].insertion.auc
    figure = presentation.figure(result)
    curve_panels = [panel for panel in figure.axes if panel.get_title().startswith(("deletion", "insertion"))]
    assert [len(panel.get_lines()) for panel in curve_panels] == [3, 3]
