"""Oracle tests of compare: readouts against the model's own logits and timm's own feature APIs
(`forward_features`, `forward_head(pre_logits=True)`, `forward_intermediates`), computed here independently."""

from __future__ import annotations

import json

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from PIL import Image

from vitcli.classes import resolve_class
from vitcli.errors import UsageError
from vitcli.experiments.compare import TOP_DIMENSIONS, compare_images
from vitcli.model import VitModel
from vitcli.spec import WeightsSpec

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
