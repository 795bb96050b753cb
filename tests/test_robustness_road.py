"""--robustness against captum.metrics.sensitivity_max (the same perturbations replayed through perturb_func) and
--road against pytorch-grad-cam's ROAD (its NoisyLinearImputer, the same noise replayed through torch's seed).

Broken on purpose once: dividing by ||map(x + delta)|| instead of ||map(x)|| fails the captum comparison; direct
neighbour (0, 1) weighted 1/12 like the diagonal ones fails the imputer comparison."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from vitcli.experiments.explain import MapSettings, explain, method_maps
from vitcli.experiments.road import impute, road
from vitcli.experiments.robustness import perturbations, robustness

pytestmark = pytest.mark.usefixtures("one_torch_thread")

METHODS = ["gradient", "rollout"]


def test_max_sensitivity_equals_captum_given_the_same_perturbations(tiny2, photo):
    from captum.metrics import sensitivity_max

    prepared = tiny2.prepare(photo)
    result = explain(tiny2, prepared, METHODS, target="4")
    settings = MapSettings(result.block)
    ours = robustness(tiny2, prepared, result.maps, 4, settings, radius=0.05, samples=3, seed=11)
    deltas = perturbations(tiny2, prepared.input.shape, 0.05, 3, 11)
    for index, method in enumerate(METHODS):

        def explanation(inputs, method=method):
            (inputs,) = inputs if isinstance(inputs, tuple) else (inputs,)  # captum's first call passes a tuple
            maps = [method_maps(tiny2, replace(prepared, input=x), [method], 4, settings)[0][0] for x in inputs]
            return (torch.stack([torch.from_numpy(item.values) for item in maps]),)  # captum wants a tuple back

        reference = sensitivity_max(
            explanation, prepared.input[None], perturb_func=lambda inputs: inputs + deltas, n_perturb_samples=3
        )
        item = ours.methods[index]
        assert item.method == method
        assert item.max == pytest.approx(float(reference[0]), rel=1e-6)
        # Average sensitivity: the mean of the same ratios, written out.
        original = explanation(prepared.input[None])[0][0].numpy()
        moved = explanation(prepared.input[None] + deltas)[0].numpy()
        ratios = [np.linalg.norm(after - original) / np.linalg.norm(original) for after in moved]
        assert item.mean == pytest.approx(float(np.mean(ratios)), rel=1e-6)


def test_perturbations_replay_from_the_seed_and_stay_in_the_radius(tiny2):
    first = perturbations(tiny2, (3, 8, 8), 0.02, 5, 3)
    assert torch.equal(first, perturbations(tiny2, (3, 8, 8), 0.02, 5, 3))
    assert not torch.equal(first, perturbations(tiny2, (3, 8, 8), 0.02, 5, 4))
    bound = 0.02 / torch.tensor(tiny2.std).reshape(3, 1, 1)
    assert (first.abs() <= bound).all() and (first.abs().amax(dim=(0, 2, 3)) > 0.9 * bound.reshape(3)).all()


def test_imputation_equals_pytorch_grad_cam_with_the_same_noise():
    from pytorch_grad_cam.metrics.road import NoisyLinearImputer

    generator = torch.Generator().manual_seed(0)
    image = torch.randn((3, 20, 24), generator=generator)
    removed = torch.zeros(20, 24, dtype=torch.bool)
    removed[0:6, 0:8] = True  # a corner: neighbours outside the image drop out
    removed[10:16, 12:20] = True
    removed[19, 23] = True
    ours = impute(image, removed, 0.01, torch.Generator().manual_seed(5))
    torch.manual_seed(5)
    reference = NoisyLinearImputer(noise=0.01)(image, (~removed).float())  # its mask: 1 = keep
    assert torch.allclose(ours, reference, atol=1e-5)
    assert torch.equal(ours[:, ~removed], image[:, ~removed])
    # Without noise, each removed pixel is the weighted mean of its neighbours (the published equation).
    exact = impute(image, removed, 0.0, torch.Generator()).double()
    padded = torch.nn.functional.pad(exact, (1, 1, 1, 1))
    weights = torch.tensor([[1 / 12, 1 / 6, 1 / 12], [1 / 6, 0, 1 / 6], [1 / 12, 1 / 6, 1 / 12]], dtype=torch.float64)
    inside = torch.nn.functional.pad(torch.ones(1, 20, 24, dtype=torch.float64), (1, 1, 1, 1))
    kernel = weights.reshape(1, 1, 3, 3)
    sums = torch.nn.functional.conv2d(padded[:, None], kernel)[:, 0]
    totals = torch.nn.functional.conv2d(inside[:, None], kernel)[:, 0]
    assert torch.allclose((sums / totals)[:, removed], exact[:, removed], atol=1e-5)


def test_road_curves_equal_pytorch_grad_cam(tiny2, photo):
    """On the 4x4 grid, p = 25, 50, 75% remove 4, 8 and 12 whole patches: pytorch-grad-cam's pixel percentiles
    (percentile 100 - p, ties impossible between patches of distinct values) remove the same pixels."""
    from pytorch_grad_cam.metrics.perturbation_confidence import (
        PerturbationConfidenceMetric,
        RemoveLeastRelevantFirst,
        RemoveMostRelevantFirst,
    )
    from pytorch_grad_cam.metrics.road import NoisyLinearImputer
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputSoftmaxTarget

    prepared = tiny2.prepare(photo)
    values = np.random.default_rng(1).permutation(16).reshape(4, 4).astype(np.float64)
    ours = road(tiny2, prepared.input, {"m": values}, 2, seed=9, percents=[25, 50, 75])
    assert ours.methods[0].morf_patches == ours.methods[0].lerf_patches == [4, 8, 12]
    cam = np.kron(values, np.ones((16, 16)))[None].astype(np.float32)
    for curve, removal in (("morf", RemoveMostRelevantFirst), ("lerf", RemoveLeastRelevantFirst)):
        for index, percent in enumerate([25, 50, 75]):
            torch.manual_seed(9)
            metric = PerturbationConfidenceMetric(removal(100 - percent, NoisyLinearImputer()))
            with torch.inference_mode():
                score = metric(
                    prepared.input[None], cam, [ClassifierOutputSoftmaxTarget(2)], tiny2.net, return_diff=False
                )
            assert getattr(ours.methods[0], curve)[index] == pytest.approx(float(score[0]), abs=1e-5)
    assert ours.methods[0].combined == pytest.approx((ours.methods[0].lerf.mean() - ours.methods[0].morf.mean()) / 2)


def test_command_reports_robustness_and_road(cli, workdir, photo):
    import json

    from conftest import RANDOM_CPU

    arguments = ["-M", "rollout", "--robustness", "--samples", "2", "--road", "--format", "json"]
    result = cli("explain", photo, *RANDOM_CPU, *arguments)
    assert result.exit_code == 0, result.stderr
    (document,) = json.loads(result.stdout)["results"]
    assert document["experiment"]["name"] == "explain-mrollout-ttop1-rob2-r0.02-ns0-road"
    audits = document["result"]["audits"]
    (entry,) = audits["robustness"]["methods"]
    assert len(entry["sensitivities"]) == 2 and entry["max_sensitivity"] == max(entry["sensitivities"])
    assert audits["robustness"]["normalized_radius"] == [0.04, 0.04, 0.04]
    (curves,) = audits["road"]["methods"]
    assert audits["road"]["percents"] == list(range(10, 100, 10)) and len(curves["morf"]) == 9
    assert audits["road"]["tie_policy"].startswith("ties removed together")
    # A map without ties: numpy's 90th percentile of the 196 x 256 pixel values (pixel 45,157.5 of 50,176) lies
    # inside the 20th largest patch, so 20 patches go at 10%, as pytorch-grad-cam removes them.
    assert curves["morf_patches"][0] == curves["lerf_patches"][0] == 20


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--robustness", "--radius", "0"], "--radius must be above 0 and at most 1"),
        (["--robustness", "--radius", "2"], "--radius must be above 0 and at most 1"),
        (["--sanity", "--sanity-threshold", "1"], "--sanity-threshold must be between 0 and 1"),
        (["--sanity", "--sanity-seed", "-1"], "--sanity-seed must be between 0 and 9223372036854775807, not -1"),
        (["--road", "--noise-seed", "-1"], "--noise-seed must be between 0 and 9223372036854775807, not -1"),
    ],
)
def test_command_refuses_bad_audit_options_before_the_model_loads(cli, photo, arguments, message, monkeypatch):
    import vitcli.loading

    from conftest import RANDOM_CPU

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model loaded"))
    result = cli("explain", photo, *RANDOM_CPU, *arguments)
    assert result.exit_code == 2
    assert message in result.stderr


def test_progress_total_equals_the_steps_reported(tiny2, photo):
    """The progress bar's total counts every pass the maps and audits report, no more, no less."""
    from vitcli.api import architecture_of
    from vitcli.experiments.explain_options import AuditOptions, GradientOptions
    from vitcli.jobs import ImageWork, Steps
    from vitcli.jobs.explain import ExplainJob

    class Counted(Steps):
        def __init__(self):
            self.total, self.done = 0, 0

        def start(self, total, description):
            self.total += total

        def advance(self, count=1):
            self.done += count

    audits = AuditOptions(robustness=True, road=True, sanity=True)
    gradients = GradientOptions(ig_steps=3, samples=2)
    job = ExplainJob(["ig", "rollout"], "1", None, "gray", False, None, 0, 0, gradients=gradients, audits=audits)
    job = job.plan(architecture_of(tiny2))
    steps = Counted()
    job.compute(ImageWork(tiny2, tiny2.prepare(photo), steps))
    assert steps.total == steps.done > 0


@pytest.mark.parametrize(
    ("normalized", "says"),
    [
        ([0.04, 0.04, 0.04], "(+-0.04 after normalization)"),
        ([0.0873, 0.0893, 0.0889], "(+-0.0873 R, 0.0893 G, 0.0889 B"),
    ],
)
def test_the_robustness_title_says_the_normalized_radius_once_when_the_channels_agree(normalized, says):
    from vitcli.experiments.robustness import MethodSensitivity, Robustness
    from vitcli.presentation.explain_audit import robustness_table

    audit = Robustness(0.02, normalized, 8, 0, [MethodSensitivity("gradient", np.array([0.5, 0.25]))])
    title = robustness_table(audit).title
    assert says in title and "8 perturbations uniform in +-0.02 of the pixel range" in title
    assert title.count("0.04") == (1 if normalized[0] == 0.04 else 0)
