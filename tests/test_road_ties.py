"""--road on maps with ties: tied patches are removed together (no order by patch number), and the curves and the
combined score equal pytorch-grad-cam's ROADCombined on the map drawn at pixel resolution.

Before the fix: ties fell in patch-number order, so an all-equal map lost its first rows under MoRF and its last rows
under LeRF, and the score on a map with many zeros differed from ROADCombined's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vitcli.experiments.road import PERCENTS, removal_masks, road

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Exact in float32 and in 1 - v, so pytorch-grad-cam's float32 cam and its LeRF on 1 - cam see the same order.
TIED = np.array([0, 0, 0, 0, 0, 0, 0, 0, 0, 0.25, 0.25, 0.5, 0.75, 1, 1, 1], dtype=np.float64)


def removed_patches(model, mask: torch.Tensor) -> np.ndarray:
    """The patches a pixel mask removes (whole patches only)."""
    grid, size = model.grid, model.grid.patch_size
    cells = mask[: grid.rows * size, : grid.cols * size].reshape(grid.rows, size, grid.cols, size)
    assert torch.equal(cells.all(dim=(1, 3)), cells.any(dim=(1, 3)))
    return cells[:, 0, :, 0].reshape(-1).numpy()


def test_tied_patches_are_removed_together_wherever_they_are(tiny2):
    grid = tiny2.grid
    # An all-equal map is one tie: both curves remove every patch at every p.
    for most, least in removal_masks(tiny2, np.full((grid.rows, grid.cols), 0.3), PERCENTS):
        assert removed_patches(tiny2, most).all() and removed_patches(tiny2, least).all()
    generator = np.random.default_rng(4)
    for _ in range(5):
        values = generator.integers(0, 3, grid.num_patches).astype(np.float64)
        moved = generator.permutation(grid.num_patches)
        plain = removal_masks(tiny2, values.reshape(grid.rows, grid.cols), PERCENTS)
        permuted = removal_masks(tiny2, values[moved].reshape(grid.rows, grid.cols), PERCENTS)
        for (most, least), (most_moved, least_moved) in zip(plain, permuted, strict=True):
            for removed, removed_moved, sign in ((most, most_moved, 1), (least, least_moved, -1)):
                patches = removed_patches(tiny2, removed)
                # No spatial bias: moving the values moves the removed patches with them.
                assert np.array_equal(removed_patches(tiny2, removed_moved), patches[moved])
                # A tie is never split: whatever is removed, everything as relevant (MoRF) or less (LeRF) goes too.
                if patches.any():
                    assert np.array_equal(patches, sign * values >= (sign * values[patches]).min())


def test_an_all_equal_map_scores_zero(tiny2, photo):
    prepared = tiny2.prepare(photo)
    result = road(tiny2, prepared.input, {"flat": np.full((4, 4), 2.0)}, 1, seed=3, percents=[10, 50, 90])
    (item,) = result.methods
    assert np.array_equal(item.morf, item.lerf) and item.combined == 0.0
    assert item.morf_patches == item.lerf_patches == [16, 16, 16]
    assert result.tie_policy.startswith("ties removed together")


def test_road_with_ties_equals_pytorch_grad_cams_road_combined(tiny2, photo, monkeypatch):
    """Oracle: pytorch-grad-cam's ROADCombined, ROADMostRelevantFirst and ROADLeastRelevantFirst on the map drawn at
    pixel resolution (each patch's value on its 16 x 16 pixels), the same model, softmax target and percentiles, its
    noise replayed from the seed for every imputed image as ours is. Within 1e-5 (float32 probabilities)."""
    import pytorch_grad_cam.metrics.road as reference
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputSoftmaxTarget

    seed, target = 9, 2
    monkeypatch.setattr(
        reference.torch,
        "randn_like",
        lambda tensor: torch.randn(tensor.shape, generator=torch.Generator().manual_seed(seed)),
    )
    prepared = tiny2.prepare(photo)
    values = np.random.default_rng(2).permutation(TIED).reshape(4, 4)
    ours = road(tiny2, prepared.input, {"m": values}, target, seed=seed)
    (item,) = ours.methods
    cam = np.kron(values, np.ones((16, 16)))[None].astype(np.float32)
    batch, targets = prepared.input[None], [ClassifierOutputSoftmaxTarget(target)]

    def score(metric) -> float:
        with torch.inference_mode():
            return float(metric(batch, cam, targets, tiny2.net, return_diff=False)[0])

    # pytorch-grad-cam's percentile q keeps the pixels below the q-th percentile: it removes 100 - q percent.
    for index, percent in enumerate(PERCENTS):
        assert item.morf[index] == pytest.approx(score(reference.ROADMostRelevantFirst(100 - percent)), abs=1e-5)
        assert item.lerf[index] == pytest.approx(score(reference.ROADLeastRelevantFirst(100 - percent)), abs=1e-5)
    with torch.inference_mode():
        combined = reference.ROADCombined(percentiles=list(PERCENTS))(batch, cam, targets, tiny2.net)
    assert item.combined == pytest.approx(float(combined[0]), abs=1e-5)
    # By hand, from numpy's linear percentile over the 4,096 pixels (pixel h = 4,095 x q / 100, patch h // 256 of the
    # sorted map): nine zeros (56% of the map) make MoRF remove the whole image from 50% on, LeRF the nine zeros up to
    # 50%; the ones (MoRF 10%) and the two 0.25s (MoRF 40%, LeRF 60%) go together.
    assert item.morf_patches == [3, 4, 5, 7, 16, 16, 16, 16, 16]
    assert item.lerf_patches == [9, 9, 9, 9, 9, 11, 12, 13, 16]


def test_nan_counts_as_below_every_value():
    from vitcli.experiments.road import removed_patches

    values = np.array([[np.nan, 3.0], [-5.0, np.nan]])
    most, least = removed_patches(values, 4, 25)
    assert most.tolist() == [False, True, False, False]
    assert least.tolist() == [True, False, False, True]  # the two NaN go together, before -5
    assert all(part.all() for part in removed_patches(np.full((2, 2), np.nan), 4, 10))  # no value: one tie
