"""Figures read at a glance: properties read back from the matplotlib objects (colour-bar limits and labels, tick
labels, layout), each against the numbers of the result it draws. Each test failed on the figure before its fix:
attention coloured from 0, rollout's label promised rescaled values, lens showed 10^0, the probe's colour bar had
fractional ticks, quadrants sat in one row of five, and predict, the attention summary and faithfulness over images
drew no figure."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from vitcli.experiments import attention as core
from vitcli.experiments.attention import patch_map

from conftest import RANDOM_CPU, result_files


@pytest.fixture(scope="module")
def prepared(vit, photo):
    return vit.prepare(photo)


def colour_bar(fig):
    """The colour bar's axes: the one with a label on its y axis and no image."""
    (axes,) = [axes for axes in fig.axes if axes.get_label() == "<colorbar>"]
    return axes


def test_an_attention_map_is_coloured_over_its_own_range_and_says_so(vit, prepared):
    from vitcli.presentation import attention

    (result,) = core.attend(vit, [prepared], core.parse_query(vit.grid, "cls"), blocks=[6], heads=[2])
    values = patch_map(vit.grid, result.maps[0].attention)
    low, high = float(np.nanmin(values)), float(np.nanmax(values))
    own = attention.figure(result)
    assert own.axes[0].images[-1].get_clim() == pytest.approx((low, high))
    assert "own range" in colour_bar(own).get_ylabel() and f"{low:.4g}" in colour_bar(own).get_ylabel()
    zero = attention.figure(result, "zero")
    assert zero.axes[0].images[-1].get_clim() == pytest.approx((0.0, high))
    assert "from 0" in colour_bar(zero).get_ylabel()
    plt.close("all")


def test_several_attention_maps_share_one_own_range(vit, prepared):
    from vitcli.presentation import attention

    (result,) = core.attend(vit, [prepared], core.parse_query(vit.grid, "P74"), blocks=[1, 12], heads=[1, 3])
    maps = [patch_map(vit.grid, row.attention) for row in result.maps]
    expected = (min(float(np.nanmin(m)) for m in maps), max(float(np.nanmax(m)) for m in maps))
    fig = attention.figure(result)
    limits = {panel.images[-1].get_clim() for panel in fig.axes if panel.images and panel.get_label() != "<colorbar>"}
    assert len(limits) == 1 and limits.pop() == pytest.approx(expected)
    assert "the maps' own range" in colour_bar(fig).get_ylabel()
    plt.close(fig)


def test_rollouts_colour_bar_ticks_are_the_raw_values_its_label_names(vit, prepared):
    from vitcli.experiments.rollout import rollout
    from vitcli.presentation import rollout as view

    (result,) = rollout(vit, [prepared], core.parse_query(vit.grid, "cls"), "mean", 0.0, 5)
    values = patch_map(vit.grid, result.row.float())
    fig = view.figure(result)
    bar = colour_bar(fig)
    label = bar.get_ylabel()
    assert "raw values" in label and "scaled to this map's maximum" not in label
    assert bar.get_ylim() == pytest.approx((float(values.min()), float(values.max())))
    ticks = [tick for tick in bar.get_yticks() if values.min() <= tick <= values.max()]
    assert ticks and all(float(values.min()) <= tick <= float(values.max()) for tick in ticks)
    plt.close(fig)


def test_the_attention_summary_has_a_figure_of_its_table(vit, prepared):
    from vitcli.experiments.attention_summary import summarize
    from vitcli.presentation import attention_summary as view

    (result,) = summarize(vit, [prepared], core.parse_query(vit.grid, "P74"))
    fig = view.figure(result)
    panels = [axes for axes in fig.axes if axes.images]
    assert len(panels) == 3
    cls = panels[0].images[0].get_array()
    first = next(entry for entry in result.entries if entry.block == 1 and entry.head == 1)
    assert cls[0, 0] == pytest.approx(100 * first.cls_mass)
    assert [label.get_text() for label in panels[0].get_yticklabels()] == [str(b) for b in range(1, 13)]
    plt.close(fig)


def test_lens_rank_axis_reads_1_10_100(vit, prepared):
    from vitcli.experiments.lens import logit_lens
    from vitcli.presentation import lens

    fig = lens.figure(logit_lens(vit, prepared))
    fig.canvas.draw()
    rank = fig.axes[1]
    labels = {label.get_text() for label in rank.get_yticklabels() if label.get_text()}
    assert {"1", "10", "100"} <= labels and not any("10^" in text or "$" in text for text in labels)
    plt.close(fig)


def test_probe_confusion_colour_bar_has_whole_number_ticks():
    from vitcli.experiments.probe import LinearHead, ProbeResult
    from vitcli.presentation import probe

    head = LinearHead(torch.zeros(2, 4), torch.zeros(2), 0.1, 3)
    result = ProbeResult("RANDOM (seed 0)", "vit", "data", ["cat", "dog"], [2, 2], 0, 0.5, 0.0, head, [], 1.0, 0.5,
                         "val", [[1, 1], [0, 1]], [0.5, 1.0], 4, 0)  # fmt: skip
    fig = probe.figure(result)
    fig.canvas.draw()
    ticks = colour_bar(fig).get_yticks()
    shown = [tick for tick in ticks if 0 <= tick <= 1]
    assert shown and all(float(tick).is_integer() for tick in shown), ticks
    plt.close(fig)


def test_occlusion_quadrants_fit_a_report_card(cli, workdir, photo):
    """Five panels in one row were 17 inches wide: at a 700-pixel card each was 130 pixels. Now 8 inches wide, the
    clean crop large and the quadrants where they lie."""
    from PIL import Image

    result = cli("occlude-quadrants", photo, *RANDOM_CPU, "-q")
    assert result.exit_code == 0, result.stderr
    with Image.open(result_files(workdir / "outputs", "occlusion-quadrants-gray-ttop1")["png"]) as image:
        width, height = image.size
        mode = image.mode
    assert width <= 1300 and width / height < 2.2, (width, height)  # 150 dpi: about 8 inches wide
    assert mode in ("RGB", "RGBA"), "no palette: colours are not reduced"


def test_predict_and_faithfulness_over_images_write_figures(cli, workdir, photo, newfoundland):
    result = cli("predict", photo, *RANDOM_CPU, "-q")
    assert result.exit_code == 0, result.stderr
    assert "png" in result_files(workdir / "outputs", "predict-k5")
    explained = cli("explain", photo, newfoundland, *RANDOM_CPU, "-q", "--method", "attention", "--faithfulness",
                    "--steps", "3", "--random-orders", "1")  # fmt: skip
    assert explained.exit_code == 0, explained.stderr
    files = result_files(workdir / "outputs", "explain-mattention-b12-gray-ttop1-f3-r1-o0-across-images")
    assert "png" in files


def test_predict_figure_shows_the_top_k_probabilities(vit, prepared):
    from vitcli.experiments.predict import predict
    from vitcli.presentation import predict as view

    with torch.inference_mode():
        logits = vit.net(prepared.input[None])[0]
    result = predict(logits, vit.labels, prepared.source, vit.spec.label, 5)
    fig = view.figure(result)
    bars = fig.axes[0].patches
    assert [bar.get_width() for bar in bars] == pytest.approx([score.probability for score in result.top])
    plt.close(fig)


def test_faithfulness_over_images_figure_draws_each_methods_mean():
    from vitcli.experiments.faithfulness import MethodSpread
    from vitcli.presentation.faithfulness import spread_figure

    spreads = [
        MethodSpread("attention", 3, 0.2, 0.05, 0.6, 0.1),
        MethodSpread("random-orders", 3, 0.4, 0.01, 0.5, 0.02),
    ]
    fig = spread_figure(spreads, "RANDOM (seed 0)")
    deletion, insertion = fig.axes
    assert [bar.get_width() for bar in deletion.patches] == pytest.approx([0.2, 0.4])
    assert [bar.get_width() for bar in insertion.patches] == pytest.approx([0.6, 0.5])
    assert [label.get_text() for label in deletion.get_yticklabels()] == ["attention", "random-orders"]
    assert "faithfulness over 3 images" in fig._suptitle.get_text()
    plt.close(fig)
