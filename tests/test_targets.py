"""Targets in embedding space (--target-image, --target-direction, --target-feature) for models with or without a
class head: scores against torch's own functions, IG completeness, occlusion drops and DLA against direct scores."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from vitcli.capture import pooled_output
from vitcli.targets import EmbeddingTarget, bind

from conftest import RANDOM_CPU, small_vit


@pytest.fixture(scope="module")
def tiny2():
    return small_vit("vit_tiny_patch16_224.augreg_in21k_ft_in1k", depth=2, img_size=64)


@pytest.fixture(scope="module")
def headless2():
    """The same small ViT without a classifier head (timm num_classes=0): its forward ends at the pooled embedding."""
    return small_vit("vit_tiny_patch16_224.augreg_in21k_ft_in1k", depth=2, img_size=64, num_classes=0)


@pytest.fixture(scope="module")
def reference_image(tmp_path_factory):
    from PIL import Image

    rng = np.random.default_rng(1)
    path = tmp_path_factory.mktemp("reference") / "reference.png"
    Image.fromarray(rng.integers(0, 256, (80, 90, 3), dtype=np.uint8)).save(path)
    return path


def own_pooled(model, inputs: torch.Tensor) -> torch.Tensor:
    """timm's own pre-logits embedding, computed without vitcli's capture layer."""
    net = model.net
    with torch.inference_mode():
        return net.forward_head(net.forward_features(inputs), pre_logits=True)


def image_target(model, path):
    return bind(EmbeddingTarget("image", reference=path, sha256="0" * 64), model)


def direction_target(model, seed: int = 3):
    direction = np.random.default_rng(seed).standard_normal(model.embed_dim)
    return bind(
        EmbeddingTarget("direction", direction_file=Path("row.npy"), direction=direction, sha256="1" * 64), model
    )


def feature_target(model, index: int = 7):
    return bind(EmbeddingTarget("feature", feature=index), model)


@pytest.fixture(scope="module")
def distilled2():
    """DeiT with its distillation token: two heads (CLS and DIST rows) whose inputs average to the embedding."""
    return small_vit("deit_tiny_distilled_patch16_224", depth=2, img_size=64)


@pytest.mark.parametrize("fixture", ["tiny2", "headless2", "distilled2"])
def test_the_forward_inside_pooled_output_is_the_pooled_embedding(request, fixture, photo):
    model = request.getfixturevalue(fixture)
    inputs = model.prepare(photo).input[None]
    with pooled_output(model.family):
        ended = model.logits(inputs)
        streamed = torch.cat(list(model.stream(model.image_logits, [inputs])))
    assert ended.shape == (1, model.embed_dim)
    assert torch.allclose(ended, own_pooled(model, inputs), atol=1e-6)
    assert torch.allclose(streamed, own_pooled(model, inputs), atol=1e-5)
    assert model.logits(inputs).shape[-1] == model.num_classes or model.num_classes == 0  # hooks are gone


@pytest.mark.parametrize("fixture", ["tiny2", "headless2"])
def test_the_image_target_is_torch_cosine_similarity_of_the_two_embeddings(request, fixture, photo, reference_image):
    from vitcli.experiments.occlusion import baseline

    model = request.getfixturevalue(fixture)
    prepared = model.prepare(photo)
    target = image_target(model, reference_image)
    expected = F.cosine_similarity(
        own_pooled(model, prepared.input[None]), own_pooled(model, model.prepare(reference_image).input[None])
    )
    assert baseline(model, prepared, target, "gray").target.score == pytest.approx(float(expected[0]), abs=1e-6)


def test_integrated_gradients_are_complete_for_the_image_target(headless2, photo, reference_image):
    from vitcli.experiments.explain import explain
    from vitcli.experiments.explain_options import GradientOptions
    from vitcli.experiments.occlusion import fill_image

    prepared = headless2.prepare(photo)
    target = image_target(headless2, reference_image)
    steps = 64
    result = explain(headless2, prepared, ["ig"], gradient_options=GradientOptions(ig_steps=steps), embedding=target)
    check = result.maps[0].attribution.completeness
    reference = own_pooled(headless2, headless2.prepare(reference_image).input[None])
    ends = own_pooled(headless2, torch.stack([prepared.input, fill_image(headless2, prepared, "gray")]))
    score, baseline_score = F.cosine_similarity(ends, reference).tolist()
    assert check.score == pytest.approx(score, abs=1e-5)
    assert check.baseline_score == pytest.approx(baseline_score, abs=1e-5)
    assert check.weight_total == pytest.approx(1 - 1 / steps)
    # As for a class logit (tests/test_gradients.py): the rest is the Riemann error of the path.
    assert check.relative_error < 0.2
    assert result.target.score == pytest.approx(score, abs=1e-5) and result.top1 is None


@pytest.mark.parametrize("kind", ["image", "direction", "feature"])
def test_an_occlusion_drop_is_the_difference_of_the_scores_computed_directly(tiny2, photo, reference_image, kind):
    from vitcli.experiments.occlusion import SlidingWindows, covered_copy, fill_image, occlude_patches

    target = {
        "image": lambda: image_target(tiny2, reference_image),
        "direction": lambda: direction_target(tiny2),
        "feature": lambda: feature_target(tiny2),
    }[kind]()
    prepared = tiny2.prepare(photo)
    windows = SlidingWindows(tiny2.grid, 16, 16)
    result = occlude_patches(tiny2, prepared, windows, target, "black")
    fill = fill_image(tiny2, prepared, "black")
    covered = torch.stack([covered_copy(prepared.input, fill, outcome.cover) for outcome in result.outcomes])
    pooled = own_pooled(tiny2, torch.cat([prepared.input[None], covered]))
    reference = own_pooled(tiny2, tiny2.prepare(reference_image).input[None])
    direction = torch.from_numpy(target.target.direction).float() if kind == "direction" else None
    scores = {
        "image": lambda: F.cosine_similarity(pooled, reference),
        "direction": lambda: pooled @ direction,
        "feature": lambda: pooled[:, 7],
    }[kind]()
    drops = [outcome.drop for outcome in result.outcomes]
    # float32 forwards batched two ways: scores a few 1e-6 of their size apart
    tolerance = 1e-5 * float(scores.abs().max())
    assert drops == pytest.approx((scores[0] - scores[1:]).tolist(), abs=tolerance)
    assert result.base.target.score == pytest.approx(float(scores[0]), abs=tolerance)
    assert result.base.top1 is None and all(outcome.top1 is None for outcome in result.outcomes)


@pytest.mark.parametrize("by", ["block", "head", "token"])
@pytest.mark.parametrize("kind", ["image", "direction", "feature"])
def test_direct_attribution_rebuilds_the_embedding_target(tiny2, headless2, photo, reference_image, kind, by):
    from vitcli.experiments.attribution import attribute

    for model in (tiny2, headless2):
        target = {
            "image": lambda model=model: image_target(model, reference_image),
            "direction": lambda model=model: direction_target(model),
            "feature": lambda model=model: feature_target(model),
        }[kind]()
        prepared = model.prepare(photo)
        result = attribute(model, prepared, None, None, by, 2 if by == "token" else None, target)
        pooled = own_pooled(model, prepared.input[None]).double()
        expected = float(target.score(pooled)[0])
        assert result.model_metric == pytest.approx(expected, abs=1e-5)
        assert abs(result.reconstruction - expected) < 1e-4
        assert result.target.kind == kind and result.contrast is None


def test_zero_ablation_changes_the_embedding_score_as_the_weight_edit_does(headless2, photo):
    """Zeroing head 2.1 by hook equals zeroing its columns of attn.proj; the score change is read off the embedding."""
    from vitcli.experiments.ablation import HEAD, Ablation, Replacements, ablate

    target = direction_target(headless2)
    prepared = headless2.prepare(photo)
    result = ablate(headless2, prepared, [Ablation(2, HEAD, 1)], Replacements("zero"), None, embedding=target)
    proj = headless2.net.blocks[1].attn.proj
    saved = proj.weight.detach().clone()
    head_dim = headless2.embed_dim // headless2.num_heads
    try:
        with torch.no_grad():
            proj.weight[:, :head_dim] = 0
        edited = float(target.score(own_pooled(headless2, prepared.input[None]))[0])
    finally:
        with torch.no_grad():
            proj.weight.copy_(saved)
    clean = float(target.score(own_pooled(headless2, prepared.input[None]))[0])
    (outcome,) = result.outcomes
    tolerance = 1e-5 * max(abs(clean), 1.0)
    assert result.clean_logit == pytest.approx(clean, abs=tolerance)
    assert outcome.target_logit == pytest.approx(edited, abs=tolerance)
    assert outcome.logit_change == pytest.approx(edited - clean, abs=tolerance)
    assert outcome.top1 is None and outcome.target_probability is None


def test_patching_every_site_of_an_embedding_target_restores_the_clean_score(headless2, photo, reference_image):
    """M of each image is the target's score of its own embedding (computed here by timm), and patching every row
    entering block 1 from CLEAN into CORRUPT restores CLEAN's M."""
    from vitcli.experiments.patching import Site, patch_images, patched_metric, run_pair

    target = image_target(headless2, reference_image)
    clean, corrupt = headless2.prepare(photo), headless2.prepare(reference_image)
    result = patch_images(
        headless2, clean, corrupt, ["attention", "mlp"], ["activation", "attribution"], embedding=target
    )
    expected = F.cosine_similarity(
        own_pooled(headless2, torch.stack([clean.input, corrupt.input])),
        own_pooled(headless2, corrupt.input[None]),
    ).tolist()
    assert result.m_clean == pytest.approx(expected[0], abs=1e-5)
    assert result.m_corrupt == pytest.approx(expected[1], abs=1e-5)  # CORRUPT is REF: cosine 1
    assert result.target is None and result.embedding.kind == "image"
    pair = run_pair(headless2, clean.input, corrupt.input, embedding=target)
    every_row = patched_metric(headless2, pair, [Site("residual", 1, None)])
    assert float(every_row[0]) == pytest.approx(result.m_clean, abs=1e-5)  # CORRUPT's run with CLEAN's rows is CLEAN


# ----- the command line


@pytest.fixture(scope="module")
def headless_checkpoint(tmp_path_factory):
    """ViT-Tiny saved without its classifier head: vitcli loads it headless (num_classes=0)."""
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    net = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0)
    path = tmp_path_factory.mktemp("headless") / "features.safetensors"
    save_file({name: tensor.contiguous() for name, tensor in net.state_dict().items()}, path)
    return path


@pytest.fixture(scope="module")
def direction_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("direction") / "probe_row.npy"
    np.save(path, np.random.default_rng(0).standard_normal(192))
    return path


COMMANDS = {
    "explain": ["explain", "--method", "gradient", "--method", "occlusion"],
    "occlude-quadrants": ["occlude-quadrants"],
    "occlude-patches": ["occlude-patches", "--size", "112"],
    "attribute": ["attribute", "--by", "head"],
    "ablate": ["ablate", "--heads", "12.1", "--blocks", "12.mlp"],
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["image", "direction", "feature"])
def test_every_command_follows_each_embedding_target_on_a_headless_model(
    cli, photo, newfoundland, headless_checkpoint, direction_file, kind
):
    option = {
        "image": ["--target-image", str(newfoundland)],
        "direction": ["--target-direction", str(direction_file)],
        "feature": ["--target-feature", "5"],
    }[kind]
    model = ["--checkpoint", str(headless_checkpoint), "--device", "cpu", "-f", "json", "--no-figures"]
    for command, arguments in COMMANDS.items():
        ran = cli(*arguments, photo, *option, *model)
        assert ran.exit_code == 0, (command, ran.stderr)
        body = json.loads(ran.stdout)["results"][0]["result"]
        described = body["target"]
        assert described["kind"] == kind, command
        assert {"image": "reference", "direction": "file", "feature": "index"}[kind] in described
    ran = cli("patch", photo, newfoundland, "--sites", "attention", *option, *model)
    assert ran.exit_code == 0, ran.stderr
    metric = json.loads(ran.stdout)["results"][0]["result"]["metric"]
    assert metric["target"]["kind"] == kind and metric["contrast"] is None


# ----- bad input: one line, exit 2, before any weights load

HEADLESS_RANDOM = ["--model", "vit_small_patch16_224.dino", *RANDOM_CPU]


@pytest.fixture
def no_loading(monkeypatch):
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))


def _bad_files(folder):
    from PIL import Image

    wrong_length = folder / "short.npy"
    np.save(wrong_length, np.ones(100))
    matrix = folder / "matrix.npy"
    np.save(matrix, np.ones((2, 192)))
    text = folder / "direction.txt"
    text.write_text("1 2 3\n")
    garbage = folder / "garbage.npy"
    garbage.write_bytes(b"not an array at all")
    not_image = folder / "reference.jpg"
    not_image.write_text("text, not a JPEG\n")
    Image.new("RGB", (8, 8)).save(folder / "fine.png")
    return wrong_length, matrix, text, garbage, not_image


def test_contradictory_or_unusable_embedding_targets_are_refused_before_loading(cli, photo, workdir, no_loading):
    wrong_length, matrix, text, garbage, not_image = _bad_files(workdir)
    fine = workdir / "fine.png"
    cases = [
        (["explain", "--target", "3", "--target-image", fine], ["--target-image and --target both name the target"]),
        (["ablate", "--target-feature", "1", "--target-image", fine], ["--target-image and --target-feature both"]),
        (["attribute", "--contrast", "3", "--target-feature", "1"], ["--contrast", "not to --target-feature"]),
        (["occlude-quadrants", "--target-feature", "192"], ["--target-feature 192 does not exist", "0..191"]),
        (["occlude-patches", "--target-feature", "-1"], ["--target-feature must be 0 or more"]),
        (["attribute", "--target-direction", wrong_length], ["shape (100,)", "a 1-D array of 192 values"]),
        (["explain", "--target-direction", matrix], ["shape (2, 192)", "give a 1-D array"]),
        (["ablate", "--target-direction", text], ["direction.txt is not a .npy file"]),
        (["explain", "--target-direction", garbage], ["garbage.npy is not a .npy array"]),
        (["occlude-quadrants", "--target-image", not_image], ["--target-image:", "is not an image"]),
        (["explain", "--target-image", workdir / "missing.png"], ["--target-image:", "no such file"]),
        (["explain", "--sanity", "--target-feature", "1"], ["--sanity", "does not apply to --target-feature"]),
    ]
    for arguments, fragments in cases:
        refused = cli(*arguments, photo, *RANDOM_CPU)
        assert refused.exit_code == 2, (arguments, refused.stderr)
        assert refused.stderr.count("\n") == 1 and refused.stderr.startswith("error: "), refused.stderr
        for fragment in fragments:
            assert fragment in refused.stderr, (arguments, refused.stderr)
    partner = workdir / "fine.png"
    refused = cli("patch", photo, partner, "--target", "3", "--target-feature", "1", *RANDOM_CPU)
    assert refused.exit_code == 2 and "--target-feature and --target both name the target" in refused.stderr


def test_a_headless_model_without_a_target_names_the_embedding_targets(cli, photo, no_loading):
    for command in (["explain"], ["occlude-patches"], ["attribute"], ["ablate"]):
        refused = cli(*command, photo, *HEADLESS_RANDOM)
        assert refused.exit_code == 2, (command, refused.stderr)
        assert refused.stderr.count("\n") == 1
        for fragment in ("no classifier head", "--target-image REF", "--target-direction", "--target-feature N"):
            assert fragment in refused.stderr, refused.stderr
    for command in (["predict"], ["lens"]):  # no embedding targets there: the options are not offered
        refused = cli(*command, photo, *HEADLESS_RANDOM)
        assert refused.exit_code == 2 and "lacks: no classifier head (num_classes=0)" in refused.stderr
        assert "--target-image" not in refused.stderr


def test_a_config_experiment_follows_an_embedding_target_with_paths_relative_to_the_config(tmp_path, newfoundland):
    import vitcli.cli  # noqa: F401  (registers every command, whose options a config's tables use)
    from vitcli.batch.config import load_config

    np.save(tmp_path / "row.npy", np.ones(192))
    config = tmp_path / "run.toml"
    config.write_text(
        f'images = ["{newfoundland}"]\ntarget = "3"\n'
        '[[experiments]]\ncommand = "explain"\nmethod = ["gradient"]\ntarget-direction = "row.npy"\n'
        '[[experiments]]\ncommand = "occlude-quadrants"\ntarget-image = "ref.png"\n'
    )
    from PIL import Image

    Image.new("RGB", (16, 16), "red").save(tmp_path / "ref.png")
    explain, occlude = load_config(config).experiments
    assert explain.options["target_direction"] == tmp_path / "row.npy" and "target" not in explain.options
    assert occlude.options["target_image"] == tmp_path / "ref.png" and "target" not in occlude.options


def test_the_python_api_takes_the_embedding_targets(tiny2, photo):
    from vitcli import api

    result = api.attribute(tiny2, photo, target_feature=4)
    assert result.to_dict()["result"]["target"]["kind"] == "feature"
    with pytest.raises(Exception, match="--target-feature 192 does not exist"):
        api.occlude_quadrants(tiny2, photo, target_feature=192)


def test_ablation_across_images_averages_the_score_change(headless2, photo, reference_image):
    from vitcli.experiments.ablation import HEAD, Ablation, Replacements, ablate, ablation_spread
    from vitcli.presentation import ablation as view

    target = feature_target(headless2)
    ablations = [Ablation(1, HEAD, 1), Ablation(2, "mlp")]
    results = [
        ablate(headless2, headless2.prepare(path), ablations, Replacements("zero"), None, embedding=target)
        for path in (photo, reference_image)
    ]
    spread = ablation_spread([json.loads(json.dumps(view.document(result))) for result in results])
    for index, item in enumerate(spread.spreads):
        expected = sum(result.outcomes[index].logit_change for result in results) / 2
        assert item.mean_logit_change == pytest.approx(expected)
        assert item.mean_probability_change is None and item.top1_changed_fraction == 0
    assert spread.measure == "score"
    assert "mean score change" in [column.header for column in view.spread_table(spread).columns]


def test_road_and_robustness_audit_the_maps_of_an_embedding_target(headless2, photo):
    """ROAD's curves are the target's score of the imputed images, computed here by timm on the same imputations."""
    from vitcli.experiments.explain import MapSettings, explain
    from vitcli.experiments.explain_audits import audit
    from vitcli.experiments.explain_options import AuditOptions, GradientOptions
    from vitcli.experiments.road import NOISE, impute, removal_masks

    target = direction_target(headless2)
    prepared = headless2.prepare(photo)
    gradients = GradientOptions(samples=2)
    result = explain(headless2, prepared, ["gradient"], gradient_options=gradients, embedding=target)
    settings = MapSettings(result.block, gradients=gradients)
    audits = audit(headless2, prepared, result, settings, AuditOptions(robustness=True, road=True), embedding=target)
    road = audits.road
    assert road.clean_probability == pytest.approx(result.target.score)
    masks = removal_masks(headless2, result.maps[0].values, road.percents)
    most = torch.stack([impute(prepared.input, m, NOISE, torch.Generator().manual_seed(road.seed)) for m, _ in masks])
    expected = target.score(own_pooled(headless2, most)).double().numpy()
    assert np.allclose(road.methods[0].morf, expected, atol=1e-5 * float(np.abs(expected).max()))
    assert audits.robustness is not None
