"""Oracle tests of compare: readouts against the model's own logits and timm's own feature APIs
(`forward_features`, `forward_head(pre_logits=True)`, `forward_intermediates`), computed here independently."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from PIL import Image

from vitcli.errors import UsageError
from vitcli.experiments.compare import TOP_DIMENSIONS, compare_images
from vitcli.model import VitModel
from vitcli.spec import WeightsSpec
from vitcli.target_class import resolve_class

from conftest import RANDOM_CPU, result_files

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def images(vit, photo, tmp_path_factory):
    """The shared synthetic photo, a second synthetic image with other content, and a third."""
    folder = tmp_path_factory.mktemp("compare")
    paths = [photo]
    for seed in (1, 2):
        pixels = np.random.default_rng(seed).integers(0, 256, size=(200, 260, 3), dtype=np.uint8)
        pixels[50:150, 60 * seed : 60 * seed + 90] = (40 * seed, 200, 90)
        path = folder / f"image{seed}.png"
        Image.fromarray(pixels).save(path)
        paths.append(path)
    return [vit.prepare(path) for path in paths]


@pytest.fixture(scope="module")
def model_outputs(vit, images):
    """Independent timm computations: the model's logits, its head input, its final rows and block outputs."""
    net = vit.net
    x = torch.stack([image.input for image in images])
    with torch.inference_mode():
        logits = net(x)
        final = net.forward_features(x)
        h = net.forward_head(final, pre_logits=True)
        blocks = net.forward_intermediates(x, return_prefix_tokens=True, output_fmt="NLC", intermediates_only=True)
    return logits, final, h, blocks


def test_readout_w_dot_h_plus_b_equals_the_model_logit(vit, images, model_outputs):
    logits, _, h, _ = model_outputs
    classes = [resolve_class(vit.labels, text) for text in ("283", "sports car", "Newfoundland dog")]
    result = compare_images(vit, images[:2], classes)
    weight, bias = vit.net.head.weight.detach(), vit.net.head.bias.detach()
    largest = 0.0
    for index, comparison in enumerate(result.images):
        assert [readout.index for readout in comparison.readouts] == [283, 817, 256]
        probabilities = logits[index].softmax(-1)
        for readout in comparison.readouts:
            c = readout.index
            assert readout.dot == pytest.approx(float(weight[c] @ h[index]), abs=TOLERANCE)
            assert readout.bias == pytest.approx(float(bias[c]), abs=0)
            assert readout.logit == pytest.approx(readout.dot + readout.bias, abs=1e-12)
            assert readout.model_logit == pytest.approx(float(logits[index, c]), abs=TOLERANCE)
            largest = max(largest, abs(readout.logit - float(logits[index, c])))
            assert readout.probability == pytest.approx(float(probabilities[c]), abs=1e-7)
            products = weight[c] * h[index]
            expected = products.abs().argsort(descending=True)[:TOP_DIMENSIONS].tolist()
            assert [entry.dimension for entry in readout.top_dimensions] == expected
            for entry in readout.top_dimensions:
                assert entry.product == pytest.approx(float(products[entry.dimension]), abs=1e-7)
        ranked = logits[index].topk(5).indices.tolist()
        assert [entry.index for entry in comparison.top] == ranked
    assert result.readout_error <= TOLERANCE
    print(f"largest |w_c . h + b_c - model logit| = {largest:.3g}")


def test_default_classes_are_each_images_top1(vit, images, model_outputs):
    logits = model_outputs[0]
    result = compare_images(vit, images[:2])
    expected = list(dict.fromkeys(int(row.argmax()) for row in logits[:2]))
    assert [readout.index for readout in result.images[0].readouts] == expected


def test_cls_rows_start_identical_and_then_differ(vit, images, model_outputs):
    _, _, _, blocks = model_outputs
    result = compare_images(vit, images[:2])
    (pair,) = result.pairs
    assert pair.cls_input_distance == 0.0 and pair.first_query_distance == 0.0
    assert pair.cls_cosine[0] == pytest.approx(1.0, abs=1e-6)
    assert pair.first_differing_block == 1
    assert all(distance > 1e-3 for distance in pair.cls_distance[1:])
    # Block outputs from timm's forward_intermediates (prefix tokens returned separately).
    for block, (patches, prefix) in enumerate(blocks, start=1):
        cosine = F.cosine_similarity(prefix[0, 0], prefix[1, 0], dim=0)
        assert pair.cls_cosine[block] == pytest.approx(float(cosine), abs=1e-5)
        assert pair.cls_distance[block] == pytest.approx(float((prefix[0, 0] - prefix[1, 0]).norm()), rel=1e-5)
        means = patches.mean(1)
        assert pair.patch_mean_cosine[block] == pytest.approx(
            float(F.cosine_similarity(means[0], means[1], dim=0)), abs=1e-5
        )


def test_the_same_image_twice_never_differs(vit, images):
    (pair,) = compare_images(vit, [images[0], images[0]]).pairs
    assert pair.first_differing_block is None
    assert max(pair.cls_distance) == pytest.approx(0.0, abs=1e-5)


def test_mean_pooling_readout_equals_head_of_the_mean_of_normalized_patch_rows(vit, images, model_outputs):
    logits, final, _, _ = model_outputs
    result = compare_images(vit, images)
    assert result.model_pooling == "token"
    for index, comparison in enumerate(result.images):
        token, mean = comparison.poolings
        assert (token.pooling, token.is_model_own, mean.pooling, mean.is_model_own) == ("token", True, "avg", False)
        with torch.inference_mode():
            expected = vit.net.head(final[index][1:].mean(0))
        assert [entry.index for entry in mean.top] == expected.topk(5).indices.tolist()
        for entry in mean.top:
            assert entry.logit == pytest.approx(float(expected[entry.index]), abs=TOLERANCE)
        for entry in token.top:
            assert entry.logit == pytest.approx(float(logits[index, entry.index]), abs=TOLERANCE)


def test_a_mean_pooled_model_reads_out_the_mean(images):
    torch.manual_seed(4)
    net = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=2, global_pool="avg")
    model = VitModel(net, WeightsSpec(model_name="vit_tiny_patch16_224", random=True, seed=4), torch.device("cpu"), 8)
    prepared = [model.prepare(image.source.path) for image in images[:2]]
    x = torch.stack([image.input for image in prepared])
    result = compare_images(model, prepared)
    with torch.inference_mode():
        logits = net(x)
    for index, comparison in enumerate(result.images):
        own = next(readout for readout in comparison.poolings if readout.is_model_own)
        assert own.pooling == "avg"
        assert own.top[0].logit == pytest.approx(float(logits[index].max()), abs=TOLERANCE)
    assert result.pooling_error <= TOLERANCE


def test_feature_similarity_matrix_and_patch_matches(vit, images, model_outputs):
    _, final, _, _ = model_outputs
    result = compare_images(vit, images)
    matrix = torch.tensor(result.cls_cosine_matrix)
    assert matrix.shape == (3, 3)
    assert torch.allclose(matrix, matrix.T, atol=0) and torch.allclose(matrix.diagonal(), torch.ones(3), atol=1e-6)
    expected = F.cosine_similarity(final[:, None, 0], final[None, :, 0], dim=-1)
    assert torch.allclose(matrix, expected, atol=1e-6)
    assert result.patch_matches is None, "patch matches are for exactly two images"
    pair = compare_images(vit, images[:2])
    a, b = F.normalize(final[0, 1:], dim=-1), F.normalize(final[1, 1:], dim=-1)
    similarity = a @ b.T
    assert pair.patch_matches.best_match == (similarity.argmax(1) + 1).tolist()
    assert np.allclose(pair.patch_matches.best_cosine, similarity.max(1).values.numpy(), atol=1e-6)


def test_classes_resolve_by_index_label_or_name(vit):
    labels = vit.labels
    assert resolve_class(labels, "283") == 283
    assert resolve_class(labels, "Persian cat") == 283
    assert resolve_class(labels, "sports car") == 817  # one of "sports car, sport car"
    assert resolve_class(labels, "NEWFOUNDLAND DOG") == 256
    with pytest.raises(UsageError, match=r"281 tabby, tabby cat"):
        resolve_class(labels, "cat")
    with pytest.raises(UsageError, match="matches 2 classes: 134 crane"):
        resolve_class(labels, "crane")
    with pytest.raises(UsageError, match="0..999"):
        resolve_class(labels, "1000")


def test_compare_needs_two_images(vit, images):
    with pytest.raises(UsageError, match="at least two"):
        compare_images(vit, images[:1])


def test_presentation_shows_what_the_result_holds(vit, images):
    import json

    import matplotlib.pyplot as plt
    from rich.console import Console

    from vitcli.presentation import compare as view

    result = compare_images(vit, images[:2], [283])
    console = Console(record=True, width=220)
    console.print(view.table(result))
    text = console.export_text()
    assert "RANDOM (seed 0) WEIGHTS" in text and "CLS row (model's own)" in text and "global_pool='token'" in text
    rows = view.rows(result)
    assert len({tuple(row) for row in rows}) == 1 and not {"image", "model", "weights"} & set(rows[0])
    depth = [row for row in rows if row["kind"] == "depth"]
    assert [row["cls_cosine"] for row in depth] == result.pairs[0].cls_cosine
    readout = next(row for row in rows if row["kind"] == "readout" and row["image_label"] == "B")
    assert readout["logit"] == result.images[1].readouts[0].logit
    assert sum(row["kind"] == "patch_match" for row in rows) == vit.grid.num_patches
    document = json.loads(json.dumps(view.document(result)))
    assert document["images"][0]["readouts"][0]["index"] == 283
    assert len(document["patch_matches"]["best_match"]) == vit.grid.num_patches
    figure = view.figure(result)
    assert np.allclose(figure.axes[0].lines[0].get_ydata(), result.pairs[0].cls_cosine)
    assert np.allclose(figure.axes[1].images[0].get_array(), np.array(result.cls_cosine_matrix))
    plt.close(figure)
    assert view.summary(result)["compare_first_differing_block_ab"] == 1


def test_compare_command(cli, workdir, vit, images, model_outputs):
    paths = [image.source.path for image in images[:2]]
    result = cli("compare", *paths, *RANDOM_CPU, "--class", "283", "--class", "Newfoundland dog", "-q")
    assert result.exit_code == 0, result.stderr
    files = result_files(workdir / "outputs", "compare-c283_256-k5")
    assert {"json", "csv", "png"} <= set(files)
    document = json.loads(files["json"].read_text())
    assert [image["path"] for image in document["subject"]["images"]] == [str(path) for path in paths]
    logits = model_outputs[0]
    for index, image in enumerate(document["result"]["images"]):
        for readout in image["readouts"]:
            assert readout["logit"] == pytest.approx(float(logits[index, readout["index"]]), abs=TOLERANCE)
    refused = cli("compare", *paths, *RANDOM_CPU, "--class", "cat")
    assert refused.exit_code == 2 and "--class 'cat' matches" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    alone = cli("compare", paths[0], *RANDOM_CPU)
    assert alone.exit_code == 2 and "at least two images" in alone.stderr


# ----- many images: per-pair detail for A~B and the pairs asked for, a heat map for all


@pytest.fixture(scope="module")
def thirteen(vit, images, tmp_path_factory):
    """Thirteen images: the three above and ten generated ones (more than the terminal's 12-image matrix)."""
    folder = tmp_path_factory.mktemp("many")
    prepared = list(images)
    rng = np.random.default_rng(7)
    for number in range(10):
        pixels = rng.integers(0, 256, size=(64, 64, 3), dtype=np.uint8)
        pixels[8:40, number : number + 24] = rng.integers(0, 256, 3)
        Image.fromarray(pixels).save(folder / f"tiny{number}.png")
        prepared.append(vit.prepare(folder / f"tiny{number}.png"))
    return prepared


def test_pairs_by_letter_number_or_all_with_a_b_first():
    from vitcli.experiments.compare import MAX_PAIRS, parse_pairs

    assert parse_pairs("C~A, 2~4", 30) == [(0, 1), (0, 2), (1, 3)]
    assert parse_pairs("A~B,b~a", 3) == [(0, 1)]
    assert parse_pairs("I27~A,27~30", 30) == [(0, 1), (0, 26), (26, 29)]
    assert parse_pairs("all", 4) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    refusals = [
        ("A-B", "is not a pair"),
        ("A~Z", "no image 'Z' among 4 (A..D, or 1..4)"),
        ("0~1", "no image '0'"),
        ("C~C", "pairs an image with itself"),
    ]
    for text, message in refusals:
        with pytest.raises(UsageError, match=re.escape(message)):
            parse_pairs(text, 4)
    with pytest.raises(UsageError, match=f"asks for 15 pairs .A~B included.; at most {MAX_PAIRS}"):
        parse_pairs("all", 6)


def test_only_the_pairs_asked_for_are_traced_and_match_timm(vit, thirteen):
    """N images, two pairs: two trajectories (not N (N - 1) / 2), each equal to the block outputs of timm's own
    forward_intermediates for that pair; the matrix still holds every pair."""
    x = torch.stack([image.input for image in thirteen])
    with torch.inference_mode():
        blocks = vit.net.forward_intermediates(x, return_prefix_tokens=True, output_fmt="NLC", intermediates_only=True)
        final = vit.net.forward_features(x)
    result = compare_images(vit, thirteen, pairs=[(0, 1), (4, 11)])
    assert [(pair.first, pair.second) for pair in result.pairs] == [(0, 1), (4, 11)]
    pair = result.pairs[1]
    for block, (_, prefix) in enumerate(blocks, start=1):
        expected = F.cosine_similarity(prefix[4, 0], prefix[11, 0], dim=0)
        assert pair.cls_cosine[block] == pytest.approx(float(expected), abs=1e-5)
    matrix = torch.tensor(result.cls_cosine_matrix)
    assert torch.allclose(matrix, F.cosine_similarity(final[:, None, 0], final[None, :, 0], dim=-1), atol=1e-6)
    with pytest.raises(UsageError, match="pairs must name images"):
        compare_images(vit, thirteen[:3], pairs=[(0, 3)])


def test_the_figure_draws_a_diverging_heat_map_centred_on_zero_and_readable_legends(vit, thirteen):
    """Issue 20, item 17. Broken once on purpose (the matrix back on viridis): the centre was not neutral and the
    ends were not opposite hues, and this failed."""
    import matplotlib.pyplot as plt

    from vitcli.presentation import compare as view

    result = compare_images(vit, thirteen, pairs=[(0, 1), (2, 3)])
    figure = view.figure(result)
    depth, matrix = figure.axes[0], figure.axes[1]
    assert len(depth.lines) == 2 * len(result.pairs)  # a CLS and a mean line per detailed pair, nothing else
    assert [text.get_text() for text in depth.get_legend().get_texts()] == [
        "A~B CLS",
        "A~B mean",
        "C~D CLS",
        "C~D mean",
    ]
    assert min(text.get_fontsize() for text in depth.get_legend().get_texts()) >= 9
    heat = matrix.images[0]
    assert np.allclose(heat.get_array(), np.array(result.cls_cosine_matrix))
    assert heat.norm(0.0) == pytest.approx(0.5) and heat.norm(-1.0) == 0 and heat.norm(1.0) == 1
    red, green, blue, _ = heat.cmap(0.5)
    assert min(red, green, blue) > 0.9  # the centre, cosine 0, is near white
    low, high = heat.cmap(0.0), heat.cmap(1.0)
    assert low[2] > low[0] and high[0] > high[2]  # blue below zero, red above: opposite hues
    colorbar = figure.axes[-1]
    assert min(label.get_fontsize() for label in colorbar.get_yticklabels()) >= 9
    assert "0: orthogonal" in colorbar.get_ylabel()
    plt.close(figure)


def test_the_terminal_shows_the_extreme_pairs_when_the_matrix_is_too_wide(vit, thirteen):
    from rich.console import Console

    from vitcli.presentation import compare as view

    result = compare_images(vit, thirteen)
    console = Console(record=True, width=250)
    console.print(view.table(result))
    text = console.export_text()
    assert "the 5 most and least similar of 78 pairs" in text
    matrix = np.array(result.cls_cosine_matrix)
    firsts, seconds = np.triu_indices(13, k=1)
    values = matrix[firsts, seconds]
    for position in (values.argmax(), values.argmin()):
        first, second = view.letter(int(firsts[position])), view.letter(int(seconds[position]))
        assert f"{first}~{second}" in text and f"{values[position]:.4f}" in text
    assert text.count("CLS cos") == 1  # the depth table: A~B alone


def test_pairs_on_the_command_line_name_the_result_and_are_checked_before_the_model_loads(
    cli, workdir, images, monkeypatch
):
    paths = [image.source.path for image in images]
    result = cli("compare", *paths, *RANDOM_CPU, "--pairs", "B~C", "-q")
    assert result.exit_code == 0, result.stderr
    files = result_files(workdir / "outputs", "compare-ctop1-k5-pA-B_B-C")
    document = json.loads(files["json"].read_text())
    assert [(pair["first"], pair["second"]) for pair in document["result"]["pairs"]] == [("A", "B"), ("B", "C")]
    assert document["experiment"]["settings"]["pairs"] == ["A~B", "B~C"]

    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args: pytest.fail("the model was loaded"))
    for pairs, message in (("A~D", "no image 'D' among 3"), ("A~A", "with itself"), ("AB", "is not a pair")):
        refused = cli("compare", *paths, *RANDOM_CPU, "--pairs", pairs)
        assert refused.exit_code == 2 and message in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
