"""Zero-shot classification on open_clip models (vitcli.zero_shot): `--labels` on a model with a text tower makes
it a classifier whose head is the label texts. Oracles: open_clip's own forward `model(image, text)` (CLIP's
`logit_scale.exp() * img @ txt.T`, SigLIP's plus `logit_bias`), and CLIP's template recipe computed directly."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F  # noqa: N812  (the usual name)

open_clip = pytest.importorskip("open_clip")

from tiny_open_clip import CONTEXT, TINY_CLIP, TINY_SIGMOID, register  # noqa: E402

from vitcli.spec import WeightsSpec  # noqa: E402

LABELS = ("dog", "cat", "car")
TEMPLATES = ("a photo of a {}.", "a blurry {} in the dark.", "{}")
SEED = 5


def zero_shot_model(name: str, templates: tuple[str, ...] = ()):
    from vitcli.loading import load_model

    register()
    spec = WeightsSpec(model_name=f"open_clip:{name}", random=True, seed=SEED, label_names=LABELS, templates=templates)
    return load_model(spec, "cpu")


def reference(name: str):
    register()
    torch.manual_seed(SEED)
    return open_clip.create_model(name, pretrained=None).eval()


@pytest.fixture(scope="module")
def clip_pair():
    return zero_shot_model(TINY_CLIP), reference(TINY_CLIP)


@pytest.fixture(scope="module")
def sigmoid_pair():
    return zero_shot_model(TINY_SIGMOID), reference(TINY_SIGMOID)


def inputs_of(model, count: int = 2) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(count, 3, *model.data_config["input_size"][1:])


def test_clip_zero_shot_logits_are_open_clips_own(clip_pair):
    model, clip = clip_pair
    images = inputs_of(model)
    tokens = open_clip.get_tokenizer(TINY_CLIP)(list(LABELS))
    with torch.no_grad():
        image_features, text_features, scale = clip(images, tokens)
    expected = scale * image_features @ text_features.T
    assert model.num_classes == len(LABELS) and model.labels == list(LABELS)
    torch.testing.assert_close(model.logits(images), expected, atol=1e-5, rtol=1e-5)
    assert model.zero_shot.kind == "softmax" and model.zero_shot.bias is None


def test_sigmoid_zero_shot_logits_are_its_own_formulation(sigmoid_pair):
    model, siglip = sigmoid_pair
    images = inputs_of(model)
    tokens = open_clip.get_tokenizer(TINY_SIGMOID)(list(LABELS))
    with torch.no_grad():
        image_features, text_features, scale, bias = siglip(images, tokens)
    expected = scale * image_features @ text_features.T + bias
    torch.testing.assert_close(model.logits(images), expected, atol=1e-5, rtol=1e-5)
    assert model.zero_shot.kind == "sigmoid" and model.zero_shot.bias == pytest.approx(float(bias.detach()))
    probabilities, kind = model.zero_shot.probabilities(expected), model.zero_shot.kind
    torch.testing.assert_close(probabilities, torch.sigmoid(expected))  # one sigmoid per label, not a softmax
    assert kind == "sigmoid"


def test_templates_are_averaged_as_clips_imagenet_recipe(clip_pair):
    _model, clip = clip_pair
    model = zero_shot_model(TINY_CLIP, TEMPLATES)
    tokenizer = open_clip.get_tokenizer(TINY_CLIP)
    images = inputs_of(model)
    with torch.no_grad():
        weights = []
        for label in LABELS:  # zeroshot_classifier of CLIP's ImageNet notebook
            embedded = F.normalize(clip.encode_text(tokenizer([t.format(label) for t in TEMPLATES])), dim=-1)
            mean = embedded.mean(dim=0)
            weights.append(mean / mean.norm())
        image_features = F.normalize(clip.encode_image(images), dim=-1)
        expected = clip.logit_scale.exp() * image_features @ torch.stack(weights).T
    torch.testing.assert_close(model.logits(images), expected, atol=1e-5, rtol=1e-5)
    assert model.zero_shot.templates == TEMPLATES


def test_the_pooled_embedding_is_still_the_image_embedding(clip_pair, sigmoid_pair):
    """Embedding targets and probe read the embedding, not the zero-shot logits."""
    for model, reference_model in (clip_pair, sigmoid_pair):
        images = inputs_of(model, 1)
        with torch.no_grad():
            torch.testing.assert_close(
                model.family.pooled(images), reference_model.encode_image(images), atol=1e-5, rtol=1e-5
            )


def test_class_targets_run_on_zero_shot_labels(cli, newfoundland):
    """explain's gradient methods follow a zero-shot class by its label, as any classifier's."""
    register()
    result = cli(
        "explain", newfoundland, "--model", f"open_clip:{TINY_CLIP}", "--weights", "random",
        "--labels", ",".join(LABELS), "--target", "cat", "--method", "gradient", "-f", "json", "--no-figures",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert '"cat"' in result.stdout


def predicted(cli, image, name: str, *options: str) -> list[dict]:
    register()
    result = cli("predict", image, "--model", f"open_clip:{name}", "--weights", "random", "-f", "jsonl", *options)
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_predict_says_clips_probabilities_are_a_softmax_over_the_labels(cli, newfoundland):
    (document,) = predicted(cli, newfoundland, TINY_CLIP, "--labels", "dog, cat ,car", "--template", "a {}.")
    result = document["result"]
    assert result["probabilities"] == "softmax"
    assert result["zero_shot"]["templates"] == ["a {}."] and result["zero_shot"]["labels"] == list(LABELS)
    logits = torch.tensor([row["logit"] for row in result["top"]], dtype=torch.float64)
    probabilities = [row["probability"] for row in result["top"]]
    assert probabilities == pytest.approx(logits.softmax(-1).tolist(), abs=1e-6)  # all three labels listed


def test_predict_says_sigmoid_probabilities_are_per_label(cli, newfoundland):
    (document,) = predicted(cli, newfoundland, TINY_SIGMOID, "--labels", ",".join(LABELS))
    result = document["result"]
    assert result["probabilities"] == "sigmoid" and "sigmoid" in result["zero_shot"]["definition"]
    for row in result["top"]:
        assert row["probability"] == pytest.approx(float(torch.tensor(row["logit"]).sigmoid()), abs=1e-7)


def test_labels_from_a_file_over_a_folder(cli, tmp_path, newfoundland, persian):
    folder = tmp_path / "photos"
    folder.mkdir()
    for image in (newfoundland, persian):
        (folder / image.name).write_bytes(image.read_bytes())
    names = tmp_path / "names"  # no .txt: --labels-file reads it as a file whatever its name
    names.write_text("dog\ncat\ncar\n", encoding="utf-8")
    documents = predicted(cli, folder, TINY_CLIP, "--labels-file", names)
    assert len(documents) == 2
    assert all(document["result"]["zero_shot"]["labels"] == list(LABELS) for document in documents)


def test_zero_shot_in_a_run_config(cli, tmp_path, newfoundland):
    register()
    (tmp_path / "labels.txt").write_text("dog\ncat\n", encoding="utf-8")
    config = tmp_path / "zero.toml"
    config.write_text(
        f"images = [{json.dumps(str(newfoundland))}]\n"
        f'[model]\nname = "open_clip:{TINY_SIGMOID}"\nweights = "random"\nlabels = "dog,cat,car"\n'
        'templates = ["a photo of a {}.", "a {}."]\n'
        '[[experiments]]\ncommand = "predict"\n',
        encoding="utf-8",
    )
    result = cli("run", config, "-f", "jsonl", "--no-figures")
    assert result.exit_code == 0, result.stderr
    (document,) = [json.loads(line) for line in result.stdout.splitlines() if '"zero_shot"' in line]
    assert document["result"]["zero_shot"]["templates"] == ["a photo of a {}.", "a {}."]
    assert [row["label"] for row in document["result"]["top"]] != [] and document["result"][
        "probabilities"
    ] == "sigmoid"
    config.write_text(config.read_text().replace('labels = "dog,cat,car"', 'labels = "labels.txt"'))
    result = cli("run", config, "-f", "jsonl", "--no-figures", "--force")  # other labels: another model
    assert result.exit_code == 0, result.stderr
    (document,) = [json.loads(line) for line in result.stdout.splitlines() if '"zero_shot"' in line]
    assert document["result"]["zero_shot"]["labels"] == ["dog", "cat"]


def test_other_labels_write_to_another_folder(cli, newfoundland, workdir):
    register()
    for labels in ("dog,cat", "car,boat"):
        predicted(cli, newfoundland, TINY_CLIP, "--labels", labels)
    assert len(list((workdir / "outputs").glob("open_clip_*"))) == 2


# ----- bad input


def refusal(cli, *arguments) -> tuple[int, str]:
    register()
    result = cli(*arguments)
    lines = result.stderr.strip().splitlines()
    return result.exit_code, lines[-1] if lines else ""


def test_an_empty_label_list_is_refused(cli, newfoundland):
    code, line = refusal(cli, "predict", newfoundland, "--model", f"open_clip:{TINY_CLIP}", "--weights", "random",
                         "--labels", ",")  # fmt: skip
    assert code == 2 and line.startswith("error: --labels ',' names no labels")


def test_a_single_softmax_label_warns_that_its_probability_is_1(cli, newfoundland):
    register()
    result = cli("predict", newfoundland, "--model", f"open_clip:{TINY_CLIP}", "--weights", "random", "--labels", "dog")
    assert result.exit_code == 0, result.stderr
    assert "warning: one zero-shot label ('dog'): a softmax over one label gives probability 1" in result.stderr


def test_a_single_sigmoid_label_needs_no_warning(cli, newfoundland):
    register()
    result = cli(
        "predict", newfoundland, "--model", f"open_clip:{TINY_SIGMOID}", "--weights", "random", "--labels", "dog"
    )
    assert result.exit_code == 0 and "warning" not in result.stderr


def test_a_label_longer_than_the_context_is_refused_naming_the_limit(cli, newfoundland, monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr("vitcli.loading_towers.load_tower", refuse)  # refused before the weights load
    long_label = " ".join(["word"] * CONTEXT)
    code, line = refusal(cli, "predict", newfoundland, "--model", f"open_clip:{TINY_CLIP}", "--weights", "random",
                         "--labels", f"dog,{long_label}")  # fmt: skip
    assert code == 2, line
    assert line.startswith("error: --labels: ") and f"reads at most {CONTEXT} (start and end tokens included)" in line


def test_a_template_without_a_text_tower_is_refused_naming_the_models_that_have_one(cli, newfoundland):
    code, line = refusal(cli, "predict", newfoundland, "--weights", "random", "--template", "a photo of a {}.")
    assert code == 2
    assert line == (
        "error: --template needs a text tower, which vit_tiny_patch16_224.augreg_in21k_ft_in1k lacks; open_clip "
        "models (--model open_clip:NAME: CLIP's and SigLIP's image towers) have one"
    )


def test_labels_on_a_model_without_a_text_tower_name_its_classes(cli, newfoundland, tmp_path):
    code, line = refusal(cli, "predict", newfoundland, "--weights", "random", "--labels", "dog,cat")
    assert (
        code == 2 and line == "error: --labels names 2 classes but vit_tiny_patch16_224.augreg_in21k_ft_in1k has 1000"
    )
    names = ",".join(f"n{index}" for index in range(1000))
    result = cli("predict", newfoundland, "--weights", "random", "--labels", names, "-f", "jsonl", "-k", "1")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["result"]["probabilities"] == "softmax" and "zero_shot" not in document["result"]
    assert document["result"]["top"][0]["label"] == f"n{document['result']['top'][0]['class_index']}"


def test_a_template_without_a_placeholder_is_refused(cli, newfoundland):
    code, line = refusal(cli, "predict", newfoundland, "--model", f"open_clip:{TINY_CLIP}", "--weights", "random",
                         "--labels", "dog,cat", "--template", "a photo")  # fmt: skip
    assert code == 2 and line == "error: --template 'a photo' holds no {} where the label goes"


def test_labels_and_labels_file_together_are_refused(cli, newfoundland, tmp_path):
    names = tmp_path / "names.txt"
    names.write_text("dog\n", encoding="utf-8")
    code, line = refusal(cli, "predict", newfoundland, "--labels", "dog", "--labels-file", names)
    assert code == 2 and line == "error: --labels and --labels-file both name the classes: give one"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("dog,,cat", "error: --labels 'dog,,cat': name 2 of the list is empty; give comma-separated names"),
        ("dog,cat,dog", "error: --labels names 'dog' twice; give each label once"),
    ],
)
def test_an_empty_or_repeated_label_is_refused(cli, newfoundland, value, message):
    code, line = refusal(cli, "predict", newfoundland, "--model", f"open_clip:{TINY_CLIP}", "--weights", "random",
                         "--labels", value)  # fmt: skip
    assert (code, line) == (2, message)


def test_a_config_label_list_with_a_comma_in_a_name_is_refused(cli, tmp_path, newfoundland):
    config = tmp_path / "zero.toml"
    config.write_text(
        f'[model]\nname = "open_clip:{TINY_CLIP}"\nlabels = ["dog", "hot, dog"]\n'
        '[[experiments]]\ncommand = "predict"\n',
        encoding="utf-8",
    )
    code, line = refusal(cli, "run", config, newfoundland, "--weights", "random")
    assert code == 2 and line == "error: model.labels: a list must hold label names, none empty and none with a comma"


def test_a_config_template_without_a_text_tower_names_no_experiment(cli, tmp_path, newfoundland):
    config = tmp_path / "timm.toml"
    config.write_text('[model]\ntemplate = "a {}."\n[[experiments]]\ncommand = "predict"\n', encoding="utf-8")
    code, line = refusal(cli, "run", config, newfoundland, "--weights", "random")
    assert code == 2 and line.startswith("error: --template needs a text tower, which vit_tiny_patch16_224")


def test_a_label_reaches_the_table_as_text_not_markup(cli, newfoundland):
    register()
    result = cli("predict", newfoundland, "--model", f"open_clip:{TINY_CLIP}", "--weights", "random",
                 "--labels", "[red]x,y")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "[red]x" in result.stdout


def test_the_python_api_takes_labels_and_templates():
    import vitcli

    register()
    model = vitcli.load_model(f"open_clip:{TINY_CLIP}", "random", labels="dog,cat", templates=["a {}."], device="cpu")
    assert model.labels == ["dog", "cat"] and model.zero_shot.templates == ("a {}.",)


@pytest.mark.parametrize("pair", ["clip_pair", "sigmoid_pair"])
@pytest.mark.parametrize("contrast", [None, 0])
def test_direct_attribution_rebuilds_the_zero_shot_logit(request, pair, contrast, newfoundland):
    """attribute on a zero-shot label: with the image embedding's norm frozen (as the LayerNorm's deviation), the
    terms add up to open_clip's own scale * cos (+ bias) from model(image, text), or to a difference of two labels."""
    from vitcli.experiments.attribution import attribute

    model, reference_model = request.getfixturevalue(pair)
    prepared = model.prepare(newfoundland)
    name = TINY_CLIP if pair == "clip_pair" else TINY_SIGMOID
    tokens = open_clip.get_tokenizer(name)(list(LABELS))
    with torch.no_grad():
        image_features, text_features, scale, *bias = reference_model(prepared.input[None], tokens)
    logits = (scale * image_features @ text_features.T + (bias[0] if bias else 0.0))[0].double().detach()
    expected = float(logits[2] - (logits[contrast] if contrast is not None else 0.0))
    for by in ("block", "head"):
        result = attribute(model, prepared, 2, contrast, by)
        assert result.model_metric == pytest.approx(expected, abs=1e-5)
        assert abs(result.reconstruction - expected) < 1e-4
    assert max(abs(term.value) for term in result.terms) > 1e-3  # terms that matter: a wrong readout would show


def test_attribute_runs_on_a_zero_shot_label_from_the_command_line(cli, newfoundland):
    register()
    result = cli(
        "attribute", newfoundland, "--model", f"open_clip:{TINY_SIGMOID}", "--weights", "random",
        "--labels", ",".join(LABELS), "--target", "cat", "--contrast", "dog", "--by", "head", "-f", "json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)["results"][0]["result"]
    assert document["target"]["label"] == "cat" and document["contrast"]["label"] == "dog"
    assert document["reconstruction"]["abs_difference"] < 1e-4
    assert document["pool_mlp_term"] is not None  # SigLIP's attention pooling, read through


def test_every_command_shows_siglips_own_sigmoid_probability(sigmoid_pair, newfoundland):
    """explain, occlusion, ablate and the faithfulness curves read a SigLIP label's probability as the model defines
    it (sigmoid of its logit), not a softmax over the labels; CLIP keeps its softmax."""
    from vitcli.experiments.ablation import HEAD, Ablation, Replacements, ablate
    from vitcli.experiments.explain import explain
    from vitcli.experiments.occlusion import baseline

    model, _reference = sigmoid_pair
    prepared = model.prepare(newfoundland)
    logits = model.logits(prepared.input[None])[0].double()
    sigmoid = torch.sigmoid(logits)
    assert not torch.allclose(sigmoid, logits.softmax(dim=-1), atol=1e-3)  # the test can tell them apart
    explained = explain(model, prepared, ["gradient"], "cat")
    assert explained.target.probability == pytest.approx(float(sigmoid[1]), abs=1e-5)
    assert baseline(model, prepared, "cat", "gray").target.probability == pytest.approx(float(sigmoid[1]), abs=1e-5)
    ablated = ablate(model, prepared, [Ablation(1, HEAD, 1)], Replacements("zero"), 1)
    assert ablated.target.probability == pytest.approx(float(sigmoid[1]), abs=1e-5)
    clip = zero_shot_model(TINY_CLIP)
    clip_logits = clip.logits(clip.prepare(newfoundland).input[None])[0]
    torch.testing.assert_close(clip.probabilities(clip_logits), clip_logits.softmax(dim=-1))
