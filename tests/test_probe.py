"""Tests of the linear probe on a synthetic two-class ImageFolder built here, with the random-weight ViT-Tiny."""

from __future__ import annotations

import json

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from vitcli.errors import UsageError, VitcliError
from vitcli.experiments.probe import (
    adapted_checkpoint,
    extract_features,
    fit_linear_head,
    read_image_folder,
    run_probe,
    split,
)

from conftest import RANDOM_CPU, result_files

PER_CLASS = 10


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """dog/ (reddish) and cat/ (bluish) images with noise and a random bright square, so no two are alike."""
    root = tmp_path_factory.mktemp("pets")
    rng = np.random.default_rng(0)
    for name, colour in (("dog", (200, 60, 40)), ("cat", (40, 80, 210))):
        (root / name).mkdir()
        for index in range(PER_CLASS):
            pixels = np.clip(rng.normal(colour, 30, size=(64, 80, 3)), 0, 255).astype(np.uint8)
            top, left = rng.integers(0, 40, size=2)
            pixels[top : top + 20, left : left + 20] = 255
            suffix = ".PNG" if index == 0 else ".png"  # suffixes in any letter case are images
            Image.fromarray(pixels).save(root / name / f"{name}{index}{suffix}")
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / ".cache").mkdir()
    return root


@pytest.fixture(scope="module")
def cached(vit, folder):
    """Every image's feature, computed once for the tests that do not test the extraction itself."""
    return extract_features(vit, read_image_folder(folder).paths, {}).new


def test_image_folder_reading(folder, tmp_path):
    data = read_image_folder(folder)
    assert data.classes == ["cat", "dog"]
    assert len(data.paths) == 2 * PER_CLASS and data.labels == [0] * PER_CLASS + [1] * PER_CLASS
    assert all(path.parent.name == data.classes[label] for path, label in zip(data.paths, data.labels, strict=True))
    with pytest.raises(VitcliError, match="not a folder"):
        read_image_folder(tmp_path / "missing")
    (tmp_path / "only").mkdir()
    (tmp_path / "empty").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "only" / "a.png")
    with pytest.raises(VitcliError, match="at least two subfolders.*found only.*without images: empty"):
        read_image_folder(tmp_path)


def test_split_is_seeded_stratified_and_disjoint():
    labels = [0] * 10 + [1] * 5 + [2] * 1
    train, val = split(labels, 0.2, seed=3)
    assert sorted(train + val) == list(range(16)) and not set(train) & set(val)
    assert [sum(labels[i] == c for i in val) for c in range(3)] == [2, 1, 0]
    assert split(labels, 0.2, seed=3) == (train, val)
    assert split(labels, 0.2, seed=4) != (train, val)
    assert split(labels, 0.0, seed=3) == (list(range(16)), [])
    for bad in (-0.1, 1.0):
        with pytest.raises(UsageError, match="--val-fraction"):
            split(labels, bad, seed=0)


def test_features_are_the_heads_input_and_the_cache_is_reused(vit, folder):
    paths = read_image_folder(folder).paths[:5]
    progress = []
    first = extract_features(vit, paths, {}, lambda done, total: progress.append((done, total)))
    assert len(first.new) == 5 and first.reused == 0 and progress[-1] == (5, 5)
    x = torch.stack([vit.prepare(path).input for path in paths])
    with torch.inference_mode():
        expected = vit.net.forward_features(x)[:, 0]  # token pooling, no fc_norm: the final normalized CLS row
    assert torch.allclose(first.features, expected, atol=1e-5, rtol=0)
    calls = []
    handle = vit.net.register_forward_hook(lambda *args: calls.append(1))
    try:
        second = extract_features(vit, paths, dict(first.new))
    finally:
        handle.remove()
    assert calls == [] and second.new == {} and second.reused == 5
    assert torch.equal(second.features, first.features)


def test_fitted_head_is_a_stationary_point_of_the_stated_objective():
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(40, 6, generator=generator)
    labels = (features[:, 0] + 0.5 * torch.randn(40, generator=generator) > 0).long()
    decay = 0.1
    head = fit_linear_head(features, labels, 2, decay)
    weight = head.weight.double().requires_grad_()
    bias = head.bias.double().requires_grad_()
    loss = (
        torch.nn.functional.cross_entropy(features.double() @ weight.T + bias, labels) + decay / 2 * weight.pow(2).sum()
    )
    loss.backward()
    assert float(weight.grad.abs().max()) < 1e-5 and float(bias.grad.abs().max()) < 1e-5
    assert head.loss == pytest.approx(float(loss.detach()), abs=1e-6)
    again = fit_linear_head(features, labels, 2, decay)
    assert torch.equal(again.weight, head.weight), "the fit is deterministic"


def test_probe_separates_two_colours_and_its_checkpoint_names_them(vit, folder, cached, tmp_path):
    data = read_image_folder(folder)
    result, new = run_probe(vit, data, dict(cached), val_fraction=0.2, seed=0)
    assert result.val_accuracy is not None and result.val_accuracy >= 0.9
    assert result.evaluated_on == "val" and new == {} and result.reused_features == len(data.paths)
    val = [image for image in result.images if image.split == "val"]
    assert len(val) == 4 and sum(map(sum, result.confusion)) == len(val)
    assert result.val_accuracy == pytest.approx(np.mean([image.predicted == image.label for image in val]))
    for label, accuracy in enumerate(result.per_class_accuracy):
        assert accuracy == pytest.approx(result.confusion[label][label] / sum(result.confusion[label]))
    print(
        f"probe: train {result.train_accuracy:.3f}, val {result.val_accuracy:.3f}, {result.head.iterations} iterations"
    )

    state, classes = adapted_checkpoint(vit, result)
    assert classes == ["cat", "dog"]
    path = tmp_path / "probe.safetensors"
    save_file(state, str(path))
    net = timm.create_model(vit.name, pretrained=False, num_classes=2)
    net.load_state_dict(load_file(str(path)), strict=True)
    net.eval()
    backbone = {name: tensor for name, tensor in vit.net.state_dict().items() if not name.startswith("head.")}
    assert all(torch.equal(net.state_dict()[name], tensor) for name, tensor in backbone.items())
    x = torch.stack([vit.prepare(image.path).input for image in val])  # a few images keep the test fast
    with torch.inference_mode():
        probabilities = net(x).softmax(-1)
    assert probabilities.argmax(-1).tolist() == [image.predicted for image in val]
    expected = torch.tensor([image.probability for image in val])
    assert torch.allclose(probabilities.max(-1).values, expected, atol=1e-5)

    again, _ = run_probe(vit, data, dict(cached), val_fraction=0.2, seed=0)
    assert torch.equal(again.head.weight, result.head.weight), "the same split and fit on a second run"


def test_presentation_shows_what_the_result_holds(vit, folder, cached):
    import json

    import matplotlib.pyplot as plt
    from rich.console import Console

    from vitcli.presentation import probe as view

    data = read_image_folder(folder)
    result, _ = run_probe(vit, data, dict(cached), val_fraction=0.2, seed=1)
    console = Console(record=True, width=200)
    console.print(view.table(result))
    text = console.export_text()
    assert "RANDOM (seed 0) WEIGHTS" in text and "confusion matrix over the val split" in text
    assert f"{result.train_accuracy:.4f}" in text and "0 computed, 20 from the cache" in text
    rows = view.rows(result)
    assert len(rows) == len(data.paths) and not {"image", "model", "weights"} & set(rows[0])
    assert sum(row["split"] == "val" for row in rows) == sum(map(sum, result.confusion))
    document = json.loads(json.dumps(view.document(result)))
    assert document["confusion"] == result.confusion and document["classes"] == ["cat", "dog"]
    figure = view.figure(result)
    assert np.array_equal(figure.axes[0].images[0].get_array(), np.array(result.confusion))
    plt.close(figure)
    assert view.summary(result)["probe_val_accuracy"] == result.val_accuracy


@pytest.mark.slow
def test_probe_command_writes_a_checkpoint_that_predict_names_and_reuses_its_cache(cli, workdir, folder):
    result = cli("probe", folder, *RANDOM_CPU, "-q")
    assert result.exit_code == 0, result.stderr
    name = "probe-vf0.2-ss0-wd0.0001"
    document = json.loads(result_files(workdir / "outputs", name)["json"].read_text())
    assert document["result"]["val_accuracy"] >= 0.9
    assert document["result"]["features"] == {"computed": 2 * PER_CLASS, "from_cache": 0}
    checkpoint = result_files(workdir / "outputs", f"{name}-checkpoint")
    assert checkpoint["labels.txt"].read_text().split() == ["cat", "dog"]
    predicted = cli("predict", folder / "cat" / "cat1.png", "--checkpoint", checkpoint["safetensors"],
                    "--device", "cpu", "-k", "2", "-f", "json", "-q")  # fmt: skip
    assert predicted.exit_code == 0, predicted.stderr
    top = json.loads(predicted.stdout)["results"][0]["result"]["top"]
    assert {entry["label"] for entry in top} == {"cat", "dog"}
    expected = next(row for row in document["result"]["images"] if row["path"].endswith("cat1.png"))
    assert top[0]["label"] == expected["predicted"]
    again = cli("probe", folder, *RANDOM_CPU, "-f", "json", "-q")
    assert json.loads(again.stdout)["results"][0]["result"]["features"] == {"computed": 0, "from_cache": 2 * PER_CLASS}
    refused = cli("probe", folder, *RANDOM_CPU, "--val-fraction", "1")
    assert refused.exit_code == 2 and "--val-fraction" in refused.stderr
