"""Integrated Gradients, SmoothGrad and gradient x input against captum and hand computations; --contrast.

Broken on purpose once each: IG with the Riemann weights not halved at the ends fails the captum comparison by about
a few percent; the contrast class's logit multiplied by 0 fails the captum contrast comparison."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vitcli.errors import UsageError
from vitcli.experiments.explain import explain
from vitcli.experiments.explain_options import GradientOptions, check_gradient_options
from vitcli.experiments.gradients import patch_sums
from vitcli.experiments.occlusion import fill_image

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def relative_error(ours, reference) -> float:
    ours, reference = np.asarray(ours, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    return float(np.abs(ours - reference).max() / np.abs(reference).max())


class Score(torch.nn.Module):
    """logit(target) - logit(contrast) as captum's forward (one scalar per example)."""

    def __init__(self, net, target: int, contrast: int):
        super().__init__()
        self.net, self.target, self.contrast = net, target, contrast

    def forward(self, inputs):
        logits = self.net(inputs)
        return logits[:, self.target] - logits[:, self.contrast]


@pytest.mark.parametrize("baseline", ["gray", "black", "blur"])
def test_integrated_gradients_equal_captum(tiny2, photo, baseline):
    from captum.attr import IntegratedGradients

    prepared = tiny2.prepare(photo)
    options = GradientOptions(ig_steps=16, baseline=baseline)
    result = explain(tiny2, prepared, ["ig"], target="3", gradient_options=options)
    (item,) = result.maps
    reference_baseline = fill_image(tiny2, prepared, baseline)
    reference = (
        IntegratedGradients(tiny2.net)
        .attribute(
            prepared.input[None],
            baselines=reference_baseline[None],
            target=3,
            n_steps=16,
            method="riemann_trapezoid",
            internal_batch_size=8,
        )[0]
        .detach()
    )
    tiny2.net.zero_grad(set_to_none=True)
    assert relative_error(item.attribution.pixels, reference) < 1e-4
    assert relative_error(item.values, patch_sums(tiny2.grid, reference.abs())) < 1e-4
    assert relative_error(item.attribution.signed, patch_sums(tiny2.grid, reference)) < 1e-4
    # Completeness: captum's trapezoid weights sum to 1 - 1/n; the rest is the Riemann error of a smooth path.
    check = item.attribution.completeness
    assert check.weight_total == pytest.approx(1 - 1 / 16)
    with torch.inference_mode():
        logits = tiny2.net(torch.stack([prepared.input, reference_baseline]))[:, 3]
    assert check.score == pytest.approx(float(logits[0]), abs=1e-4)
    assert check.baseline_score == pytest.approx(float(logits[1]), abs=1e-4)
    assert check.relative_error < 0.2


def test_contrast_equals_captum_on_the_logit_difference(tiny2, photo):
    from captum.attr import InputXGradient, IntegratedGradients

    prepared = tiny2.prepare(photo)
    options = GradientOptions(ig_steps=8)
    result = explain(tiny2, prepared, ["ig", "gradient"], target="3", contrast="5", gradient_options=options)
    assert result.contrast.index == 5
    maps = {item.method: item for item in result.maps}
    score = Score(tiny2.net, 3, 5)
    ig = IntegratedGradients(score).attribute(
        prepared.input[None], baselines=torch.zeros_like(prepared.input)[None], n_steps=8, method="riemann_trapezoid"
    )[0]
    assert relative_error(maps["ig"].attribution.pixels, ig.detach()) < 1e-4
    gradient = InputXGradient(score).attribute(prepared.input[None].clone().requires_grad_(True))[0]
    assert relative_error(maps["gradient"].attribution.pixels, gradient.detach()) < 1e-4
    plain = explain(tiny2, prepared, ["gradient"], target="3")
    assert not np.allclose(plain.maps[0].values, maps["gradient"].values)


def test_contrast_changes_the_hooked_gradient_maps_by_the_difference(tiny2, photo):
    """Grad-CAM's channel weights are linear in the gradient: contrast = the map of (dy_t - dy_c) before the ReLU."""
    prepared = tiny2.prepare(photo)
    both = explain(tiny2, prepared, ["gradcam", "relevance"], target="3", contrast="5")
    alone = explain(tiny2, prepared, ["gradcam", "relevance"], target="3")
    assert "logit - logit of class 5" in both.maps[0].definition
    assert not np.allclose(both.maps[0].values, alone.maps[0].values)


def test_smoothgrad_equals_the_mean_gradient_over_replayed_noise(tiny2, photo):
    prepared = tiny2.prepare(photo)
    options = GradientOptions(samples=4, noise=0.1, seed=7)
    (item,) = explain(tiny2, prepared, ["smoothgrad"], target="2", gradient_options=options).maps
    image = prepared.input
    sigma = 0.1 * float(image.max() - image.min())
    noise = torch.randn((4, *image.shape), generator=torch.Generator().manual_seed(7)) * sigma
    noisy = (image + noise).requires_grad_(True)
    (gradient,) = torch.autograd.grad(tiny2.net(noisy)[:, 2].sum(), noisy)
    expected = gradient.mean(dim=0)
    assert relative_error(item.attribution.pixels, expected) < 1e-5
    assert relative_error(item.values, patch_sums(tiny2.grid, expected.abs())) < 1e-5
    again = explain(tiny2, prepared, ["smoothgrad"], target="2", gradient_options=options).maps[0]
    assert np.array_equal(again.values, item.values)  # seeded


def test_gradient_options_are_bounded():
    for options, message in [
        (GradientOptions(ig_steps=0), "--ig-steps must be between 2 and 1024"),
        (GradientOptions(ig_steps=5000), "--ig-steps"),
        (GradientOptions(samples=0), "--samples must be between 1 and 1000"),
        (GradientOptions(noise=0), "--noise"),
        (GradientOptions(baseline="white"), "--baseline"),
    ]:
        with pytest.raises(UsageError, match=message):
            check_gradient_options(options)


def test_contrast_equal_to_the_target_is_refused(tiny2, photo):
    with pytest.raises(UsageError, match="--contrast 3 is the target"):
        explain(tiny2, tiny2.prepare(photo), ["gradient"], target="3", contrast="3")


def test_command_writes_every_raw_map_as_an_array_named_in_the_json(cli, workdir, vit, photo):
    from conftest import RANDOM_CPU, result_files

    arguments = ["-M", "gradient", "-M", "rollout", "--target", "3", "--contrast", "5", "--format", "json"]
    result = cli("explain", photo, *RANDOM_CPU, *arguments)
    assert result.exit_code == 0, result.stderr
    name = "explain-mgradient_rollout-t3-c5"
    files = result_files(workdir / "outputs", name)
    assert set(files) == {"json", "csv", "png", "gradient.npy", "gradient.pixels.npy", "rollout.npy"}
    document = json.loads(files["json"].read_text())["result"]
    assert document["contrast"]["class_index"] == 5
    listed = {entry["file"]: entry for entry in document["arrays"]}
    assert set(listed) == {path.name for suffix, path in files.items() if suffix.endswith("npy")}
    maps = {entry["method"]: entry for entry in document["maps"]}
    for path in (files["gradient.npy"], files["rollout.npy"], files["gradient.pixels.npy"]):
        array = np.load(path, allow_pickle=False)
        assert list(array.shape) == listed[path.name]["shape"] and str(array.dtype) == listed[path.name]["dtype"]
    assert np.array_equal(np.load(files["rollout.npy"]), np.array(maps["rollout"]["values"]))
    pixels = np.load(files["gradient.pixels.npy"])
    assert pixels.shape == (3, 224, 224)
    assert np.allclose(patch_sums(vit.grid, torch.from_numpy(pixels)), maps["gradient"]["signed_values"], rtol=1e-6)
    direct = explain(vit, vit.prepare(photo), ["gradient"], target="3", contrast="5").maps[0]
    assert relative_error(pixels, direct.attribution.pixels) < 1e-5


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["-M", "ig", "--ig-steps", "0"], "--ig-steps must be between 2 and 1024, not 0"),
        (["-M", "smoothgrad", "--samples", "0"], "--samples must be between 1 and 1000, not 0"),
        (["-M", "smoothgrad", "--samples", "1001"], "--samples must be between 1 and 1000"),
        (["-M", "smoothgrad", "--noise", "0"], "--noise must be above 0"),
        (["-M", "ig", "--target", "3", "--contrast", "3"], "--contrast 3 is the target class 3"),
        (["-M", "rollout", "--contrast", "3"], "--contrast applies to the gradient methods"),
    ],
)
def test_command_refuses_bad_gradient_options_before_the_model_loads(cli, photo, arguments, message, monkeypatch):
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model loaded"))
    from conftest import RANDOM_CPU

    result = cli("explain", photo, *RANDOM_CPU, *arguments)
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
