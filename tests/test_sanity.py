"""--sanity: model-parameter randomisation (cascading and independent) and the random-logit test.

Broken on purpose once: not restoring the weights before each independent step (so they accumulate) fails the
named-modules test; SSIM without the sample-covariance factor fails the scikit-image comparison."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from vitcli.experiments.explain import MapSettings, explain, method_maps
from vitcli.experiments.sanity import randomised_models, sanity, similarity, ssim

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_ssim_and_spearman_equal_scikit_image_and_scipy():
    from scipy.stats import spearmanr
    from skimage.metrics import structural_similarity

    generator = np.random.default_rng(0)
    for shape in [(14, 14), (4, 4), (5, 9)]:
        first, second = generator.normal(size=shape), generator.normal(size=shape)
        scaled = [(np.abs(m) - np.abs(m).min()) / (np.abs(m).max() - np.abs(m).min()) for m in (first, second)]
        window = min(7, *(size if size % 2 else size - 1 for size in shape))
        reference = structural_similarity(*scaled, data_range=1.0, win_size=window)
        assert ssim(first, second) == pytest.approx(reference, abs=1e-12)
        found = similarity(first, second)
        assert found.spearman_signed == pytest.approx(spearmanr(first.ravel(), second.ravel()).statistic, abs=1e-12)
        assert found.spearman_abs == pytest.approx(spearmanr(np.abs(first).ravel(), np.abs(second).ravel()).statistic)


def moved_off_init(model):
    """The model with every parameter moved off its initial value, so a re-initialised module always differs."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.net.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return model


@pytest.fixture(scope="module")
def trained_like():
    from conftest import small_vit

    return moved_off_init(small_vit("vit_tiny_patch16_224.augreg_in21k_ft_in1k", depth=2, img_size=64))


@pytest.fixture(scope="module")
def registers_like():
    """The same with 4 register tokens (a reg_token parameter beside cls_token)."""
    from conftest import small_vit

    return moved_off_init(small_vit("vit_tiny_patch16_224", depth=2, img_size=64, reg_tokens=4))


def owner(parameter: str) -> str:
    """The module a state-dict entry belongs to, named as the steps list modules: "blocks.1", "patch_embed",
    "pos_embed", "cls_token", "reg_token", ..."""
    parts = parameter.split(".")
    return ".".join(parts[:2]) if parts[0] == "blocks" else parts[0]


@pytest.mark.parametrize(
    ("model", "embeddings"),
    [
        ("trained_like", ["patch_embed", "pos_embed", "cls_token"]),
        ("registers_like", ["patch_embed", "pos_embed", "cls_token", "reg_token"]),
    ],
)
def test_randomised_weights_differ_in_exactly_the_named_modules(model, embeddings, request):
    """Before the fix the last cascading step listed "embeddings", no parameter's name."""
    trained_like = request.getfixturevalue(model)
    net = trained_like.net
    original = copy.deepcopy(net.state_dict())
    seen = {}
    steps = 0
    for kind, name, modules in randomised_models(trained_like, seed=3):
        state = net.state_dict()
        changed = {key for key in state if not torch.equal(state[key], original[key])}
        named = {key for key in state if owner(key) in modules}
        assert changed == named, (kind, name)
        assert set(modules) <= {owner(key) for key in changed}  # every listed module exists and changed
        for key in named:  # a module gets the same random weights whichever step randomises it
            assert torch.equal(seen.setdefault(key, state[key].clone()), state[key])
        steps += 1
        if kind == "cascading":
            last_cascading = modules
    assert steps == 2 * trained_like.depth + 1
    assert last_cascading == [f"blocks.{index}" for index in range(trained_like.depth - 1, -1, -1)] + embeddings
    assert all(torch.equal(value, original[key]) for key, value in net.state_dict().items())  # restored
    # timm's fresh initialisers: LayerNorm back to 1 and 0, Linear biases 0, Linear weights trunc_normal(0.02).
    with torch.no_grad():
        for _ in randomised_models(trained_like, seed=3):
            block = net.blocks[-1]
            assert torch.equal(block.norm1.weight, torch.ones_like(block.norm1.weight))
            assert torch.equal(block.attn.qkv.bias, torch.zeros_like(block.attn.qkv.bias))
            assert float(block.mlp.fc1.weight.std()) == pytest.approx(0.02, rel=0.05)  # truncated at +-2, not 2 sd
            assert float(block.mlp.fc1.weight.abs().max()) <= 2.0
            break


def test_step_zero_is_exactly_one_and_the_model_is_unchanged(trained_like, photo):
    prepared = trained_like.prepare(photo)
    methods = ["gradient", "rollout", "gradcam"]
    result = explain(trained_like, prepared, methods, target="3")
    settings = MapSettings(result.block)
    before = trained_like.logits(prepared.input[None])

    def compute(class_index):
        maps, _ = method_maps(trained_like, prepared, methods, class_index, settings)
        return {item.method: item.values for item in maps}

    checked = sanity(trained_like, compute, {item.method: item.values for item in result.maps}, 3, 0, 0.5)
    first = checked.steps[0]
    assert first.kind == "original"
    assert all(
        value == (1.0, 1.0, 1.0)
        for value in map(lambda s: (s.spearman_abs, s.spearman_signed, s.ssim), first.similarity.values())
    )
    assert [step.kind for step in checked.steps].count("cascading") == trained_like.depth + 1
    assert checked.random_class != 3
    assert torch.equal(trained_like.logits(prepared.input[None]), before)
    # A map recomputed on the randomised model is the map of that model: the step's maps equal a fresh computation.
    assert not np.array_equal(checked.steps[-1].maps["gradient"], first.maps["gradient"])


def edge_map(prepared, grid) -> np.ndarray:
    """An 'explanation' that ignores the model: the image's gradient magnitude summed per patch."""
    gray = prepared.crop.mean(dim=0).double()
    edges = (gray[1:, :-1] - gray[:-1, :-1]).abs() + (gray[:-1, 1:] - gray[:-1, :-1]).abs()
    edges = torch.nn.functional.pad(edges, (0, 1, 0, 1))
    size = grid.patch_size
    return edges.reshape(grid.rows, size, grid.cols, size).sum(dim=(1, 3)).numpy()


def test_an_edge_map_fails_at_every_step_and_a_gradient_map_moves(trained_like, photo):
    prepared = trained_like.prepare(photo)
    settings = MapSettings(trained_like.depth)

    def compute(class_index):
        (gradient,), _ = method_maps(trained_like, prepared, ["gradient"], class_index, settings)
        return {"edges": edge_map(prepared, trained_like.grid), "gradient": gradient.values}

    checked = sanity(trained_like, compute, compute(3), 3, 0, 0.5)
    for step in checked.steps:
        assert step.similarity["edges"].spearman_abs == 1.0 and step.similarity["edges"].ssim == 1.0
    assert not checked.passed("edges")
    assert checked.steps[-1].similarity["gradient"].spearman_abs < 1.0


def test_presentation_writes_the_steps_arrays_rows_and_figure(trained_like, photo):
    import io

    from vitcli.api import architecture_of
    from vitcli.experiments.explain_audits import audit
    from vitcli.experiments.explain_options import AuditOptions
    from vitcli.jobs.explain import ExplainJob

    prepared = trained_like.prepare(photo)
    options = AuditOptions(sanity=True, sanity_seed=2)
    result = explain(trained_like, prepared, ["gradient", "rollout"], target="3")
    result.audits = audit(trained_like, prepared, result, MapSettings(result.block), options)
    job = ExplainJob(["gradient", "rollout"], "3", None, "gray", False, None, 0, 0, audits=options)
    job = job.plan(architecture_of(trained_like))
    presentation = job.present(result)
    body = presentation.document
    steps = body["audits"]["sanity"]["steps"]
    depth = trained_like.depth
    assert [step["kind"] for step in steps] == ["original"] + ["cascading"] * (depth + 1) + ["independent"] * depth
    assert steps[-1]["modules"] == ["blocks.1"]
    assert steps[depth + 1]["modules"] == ["blocks.1", "blocks.0", "patch_embed", "pos_embed", "cls_token"]
    listed = {entry["file"][len(job.name()) + 1 :]: entry for entry in body["arrays"]}
    stacked = np.load(io.BytesIO(presentation.extra_files["sanity.gradient.npy"]))
    assert list(stacked.shape) == listed["sanity.gradient.npy"]["shape"] == [2 * depth + 3, 4, 4]
    assert np.array_equal(stacked[0], result.maps[0].values)
    assert np.array_equal(stacked[-1], result.audits.sanity.random_logit_maps["gradient"])
    rows = presentation.extra_files["sanity.csv"]
    assert len(rows) == (2 * depth + 2 + 1) * 2
    assert "RANDOM" in body["audits"]["sanity"]["note"]
    stream = io.BytesIO()
    presentation.extra_files["sanity.png"](stream)
    assert stream.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_command_runs_the_sanity_checks(cli, workdir, photo):
    import json

    from conftest import RANDOM_CPU, result_files

    result = cli("explain", photo, *RANDOM_CPU, "-M", "rollout", "--sanity", "--format", "json")
    assert result.exit_code == 0, result.stderr
    (document,) = json.loads(result.stdout)["results"]
    name = "explain-mrollout-ttop1-san0-th0.5"
    assert document["experiment"]["name"] == name
    files = result_files(workdir / "outputs", name)
    assert {"sanity.csv", "sanity.png", "sanity.rollout.npy", "rollout.npy"} <= set(files)
    (entry,) = document["result"]["audits"]["sanity"]["methods"]
    assert entry["method"] == "rollout" and isinstance(entry["passed"], bool)


def test_the_figure_of_a_12_block_model_fits_a_laptop_screen_with_readable_text():
    """Before the fix: one strip of 16 columns, 3,857 px wide, step titles at 6 pt."""
    import io

    import matplotlib.text
    from PIL import Image

    from vitcli import figures
    from vitcli.experiments.sanity import Sanity, SanityStep, Similarity, schedule
    from vitcli.presentation.explain_sanity import figure, figure_writer

    generator = np.random.default_rng(0)
    methods = ["gradient", "rollout", "gradcam"]
    steps = [("original", "original", [])] + schedule(12, ["patch_embed", "pos_embed", "cls_token"])
    score = Similarity(0.5, 0.4, 0.3)
    result = Sanity(
        0,
        0.5,
        [
            SanityStep(
                kind, name, modules, {m: generator.random((14, 14)) for m in methods}, dict.fromkeys(methods, score)
            )
            for kind, name, modules in steps
        ],
        7,
        {m: generator.random((14, 14)) for m in methods},
        dict.fromkeys(methods, score),
    )
    crop = generator.integers(0, 256, (224, 224, 3), dtype=np.uint8)
    stream = io.BytesIO()
    figure_writer(result, crop, "RANDOM weights")(stream)
    width, height = Image.open(io.BytesIO(stream.getvalue())).size
    assert width <= 1600, (width, height)
    built = figure(result, crop, "RANDOM weights")
    try:
        titles = [panel.title for panel in built.get_axes() if panel.get_title()]
        cascade = [name for kind, name, _ in steps if kind != "independent"]
        # Every map panel names its step (not only the first method's), the names in order, at 9 pt or more.
        assert [title.get_text().replace("\n", " ") for title in titles] == cascade * len(methods)
        assert min(title.get_fontsize() for title in titles) >= 9
        texts = [text for text in built.findobj(matplotlib.text.Text) if text.get_text() and text.get_visible()]
        assert min(text.get_fontsize() for text in texts) >= 8  # tick labels, legends and axis labels too
    finally:
        figures.plt.close(built)
