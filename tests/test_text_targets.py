"""Text targets (--target-text T, --contrast-text U): scale x cosine similarity of the image embedding and the text
embedding, checked against open_clip's own encode_image and encode_text on a random ViT-S-32, with IG completeness,
contrasts as differences of single targets and direct attribution rebuilding the score; refusals before loading."""

from __future__ import annotations

import pytest

from vitcli.targets import parse_embedding_target

from conftest import RANDOM_CPU


@pytest.fixture
def no_loading(monkeypatch):
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))


def test_text_targets_name_their_texts_and_distinct_texts_name_distinct_results():
    dog = parse_embedding_target(None, None, None, None, text="a dog")
    versus = parse_embedding_target(None, None, None, None, text="a dog", contrast_text="a cat")
    other = parse_embedding_target(None, None, None, None, text="a cat")
    assert len({dog.name_part, versus.name_part, other.name_part}) == 3
    assert (
        dog.name_part.startswith("ttxt")
        and dog.name_part == parse_embedding_target(None, None, None, None, text="a dog").name_part
    )
    described = versus.describe()
    assert described["kind"] == "text" and described["text"] == "a dog" and described["contrast_text"] == "a cat"
    assert (
        "scale x cosine similarity" in described["score"] and "minus the same for contrast_text" in described["score"]
    )


def test_text_target_options_are_refused_before_loading(cli, photo, newfoundland, no_loading):
    """A timm classifier has no text tower; the other refusals need no model at all."""
    cases = [
        (["explain", "--target-text", "a dog"], ["--target-text needs a model with a text tower", "open_clip models"]),
        (["attribute", "--contrast-text", "a cat"], ["--contrast-text applies to --target-text only"]),
        (["ablate", "--target-text", "a dog", "--target", "3"], ["--target-text and --target both name the target"]),
        (
            ["occlude-patches", "--target-text", "a dog", "--target-image", newfoundland],
            ["--target-image and --target-text both name the target"],
        ),
        (["occlude-quadrants", "--target-text", " "], ["--target-text is empty"]),
        (["explain", "--target-text", "a dog", "--contrast-text", ""], ["--contrast-text is empty"]),
        (["explain", "--target-text", "a dog", "--contrast-text", "a dog"], ["is the target text", "would be 0"]),
        (["attribute", "--target-text", "a dog", "--contrast", "3"], ["not to --target-text", "use --contrast-text"]),
    ]
    for arguments, fragments in cases:
        refused = cli(*arguments, photo, *RANDOM_CPU)
        assert refused.exit_code == 2, (arguments, refused.stderr)
        assert refused.stderr.count("\n") == 1 and refused.stderr.startswith("error: "), refused.stderr
        for fragment in fragments:
            assert fragment in refused.stderr, (arguments, refused.stderr)
    refused = cli("patch", photo, newfoundland, "--target-text", "a dog", *RANDOM_CPU)
    assert refused.exit_code == 2 and "--target-text needs a model with a text tower" in refused.stderr


# ----- exactness on a random CLIP (open_clip's ViT-S-32: its own encode_image and encode_text are the oracle)

NAME = "ViT-S-32"
DOG, CAT = "a photo of a dog", "a photo of a cat"


@pytest.fixture(scope="module")
def clip():
    """vitcli's model of open_clip:ViT-S-32 and open_clip's own random CLIP of the same seed (the same weights)."""
    open_clip = pytest.importorskip("open_clip")
    import torch

    from vitcli.loading import load_model
    from vitcli.spec import WeightsSpec

    model = load_model(WeightsSpec(model_name=f"open_clip:{NAME}", random=True, seed=0), "cpu")
    torch.manual_seed(0)
    reference = open_clip.create_model(NAME, pretrained=None).eval()
    return model, reference, open_clip.get_tokenizer(NAME)


@pytest.fixture(scope="module")
def siglip():
    """vitcli's model of the SigLIP-like pair (tests/tiny_open_clip.py) and open_clip's own of the same seed."""
    open_clip = pytest.importorskip("open_clip")
    import torch
    from tiny_open_clip import TINY_SIGMOID, register

    from vitcli.loading import load_model
    from vitcli.spec import WeightsSpec

    register()
    model = load_model(WeightsSpec(model_name=f"open_clip:{TINY_SIGMOID}", random=True), "cpu")
    torch.manual_seed(0)
    reference = open_clip.create_model(TINY_SIGMOID, pretrained=None).eval()
    return model, reference, open_clip.get_tokenizer(TINY_SIGMOID)


def text_target(model, text, contrast_text=None):
    from vitcli.targets import bind

    return bind(parse_embedding_target(None, None, None, None, text=text, contrast_text=contrast_text), model)


def own_scores(reference, tokenizer, inputs, texts):
    """(images, texts): logit_scale.exp() x cosine of open_clip's own encode_image and encode_text."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    with torch.no_grad():
        images = reference.encode_image(inputs)
        embedded = reference.encode_text(tokenizer(texts))
        cosine = F.cosine_similarity(images[:, None], embedded[None], dim=-1)
        return (reference.logit_scale.exp() * cosine).double()


@pytest.mark.slow
def test_the_text_score_is_open_clips_scaled_cosine(clip, photo):
    import torch

    from vitcli.experiments.occlusion import baseline

    model, reference, tokenizer = clip
    prepared = model.prepare(photo)
    expected = own_scores(reference, tokenizer, prepared.input[None], [DOG, CAT])[0]
    with torch.no_grad():  # open_clip's forward: unit features and the scale; its logits are the same numbers
        image_features, text_features, scale = reference(prepared.input[None], tokenizer([DOG, CAT]))
    torch.testing.assert_close((scale * image_features @ text_features.T)[0].double(), expected, atol=1e-5, rtol=0)
    dog = text_target(model, DOG)
    assert baseline(model, prepared, dog, "gray").target.score == pytest.approx(float(expected[0]), abs=1e-5)
    assert dog.target.scale == pytest.approx(float(reference.logit_scale.detach().exp()), rel=1e-6)
    versus = text_target(model, DOG, CAT)
    difference = float(expected[0] - expected[1])
    assert baseline(model, prepared, versus, "gray").target.score == pytest.approx(difference, abs=1e-5)
    described = versus.describe(difference)
    assert described["kind"] == "text" and described["scale"] == dog.target.scale
    assert (described["text"], described["contrast_text"]) == (DOG, CAT)


@pytest.mark.slow
def test_integrated_gradients_are_complete_for_a_text_target(clip, photo):
    import torch

    from vitcli.experiments.explain import explain
    from vitcli.experiments.explain_options import GradientOptions
    from vitcli.experiments.occlusion import fill_image

    model, reference, tokenizer = clip
    prepared = model.prepare(photo)
    steps = 32
    result = explain(
        model, prepared, ["ig"], gradient_options=GradientOptions(ig_steps=steps), embedding=text_target(model, DOG)
    )
    check = result.maps[0].attribution.completeness
    ends = torch.stack([prepared.input, fill_image(model, prepared, "gray")])
    score, baseline_score = own_scores(reference, tokenizer, ends, [DOG])[:, 0].tolist()
    assert check.score == pytest.approx(score, abs=1e-5)
    assert check.baseline_score == pytest.approx(baseline_score, abs=1e-5)
    assert check.weight_total == pytest.approx(1 - 1 / steps)
    # As for a class logit and the image target (tests/test_targets.py): the rest is the Riemann error of the path.
    assert check.relative_error < 0.2


@pytest.mark.slow
def test_a_contrast_text_is_the_difference_of_the_two_single_targets(clip, photo):
    """Gradient x input and IG attributions (per pixel and their signed patch sums), and every attribute term:
    T - U = (T) - (U)."""
    import numpy as np

    from vitcli.experiments.attribution import attribute
    from vitcli.experiments.explain import explain
    from vitcli.experiments.explain_options import GradientOptions

    model, _reference, _tokenizer = clip
    prepared = model.prepare(photo)
    targets = [text_target(model, DOG), text_target(model, CAT), text_target(model, DOG, CAT)]
    options = GradientOptions(ig_steps=8)
    dog, cat, versus = (
        explain(model, prepared, ["gradient", "ig"], gradient_options=options, embedding=target) for target in targets
    )
    for single_dog, single_cat, both in zip(dog.maps, cat.maps, versus.maps, strict=True):
        expected = single_dog.attribution.pixels - single_cat.attribution.pixels
        tolerance = 1e-4 * float(np.abs(expected).max())
        np.testing.assert_allclose(both.attribution.pixels, expected, atol=tolerance, rtol=0)
        expected = single_dog.attribution.signed - single_cat.attribution.signed  # the maps show |.|: not linear
        np.testing.assert_allclose(both.attribution.signed, expected, atol=1e-4 * float(np.abs(expected).max()), rtol=0)
    assert versus.target.score == pytest.approx(dog.target.score - cat.target.score, abs=1e-5)
    for by, block in (("block", None), ("head", None), ("token", 12)):
        dog, cat, versus = (attribute(model, prepared, None, None, by, block, target) for target in targets)
        expected = np.array([term.value for term in dog.terms]) - np.array([term.value for term in cat.terms])
        np.testing.assert_allclose([term.value for term in versus.terms], expected, atol=1e-6, rtol=0)
        assert versus.model_metric == pytest.approx(dog.model_metric - cat.model_metric, abs=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("by", ["block", "head", "token"])
def test_direct_attribution_rebuilds_the_text_score(clip, photo, by):
    from vitcli.experiments.attribution import attribute

    model, reference, tokenizer = clip
    prepared = model.prepare(photo)
    for target, expected in (
        (text_target(model, DOG), lambda scores: scores[0]),
        (text_target(model, DOG, CAT), lambda scores: scores[0] - scores[1]),
    ):
        result = attribute(model, prepared, None, None, by, 12 if by == "token" else None, target)
        score = float(expected(own_scores(reference, tokenizer, prepared.input[None], [DOG, CAT])[0]))
        assert result.model_metric == pytest.approx(score, abs=1e-5)
        assert abs(result.reconstruction - score) < 1e-4
        assert result.target.kind == "text" and result.contrast is None


# ----- the command line, on a tiny random CLIP (tests/tiny_open_clip.py: a 16-token context)

TINY_COMMANDS = {
    "explain": ["explain", "--method", "gradient", "--method", "occlusion", "--faithfulness", "--steps", "4", "--road"],
    "occlude-quadrants": ["occlude-quadrants"],
    "occlude-patches": ["occlude-patches"],
    "attribute": ["attribute", "--by", "head"],
    "ablate": ["ablate", "--heads", "2.1"],
}


@pytest.fixture
def tiny_clip():
    from tiny_open_clip import TINY_CLIP, register

    pytest.importorskip("open_clip")
    register()
    return ["--model", f"open_clip:{TINY_CLIP}", *RANDOM_CPU]


@pytest.mark.slow
def test_every_target_command_follows_a_text_target(cli, photo, newfoundland, tiny_clip):
    import json

    texts = ["--target-text", "a dog", "--contrast-text", "a cat"]
    scores = {}
    for command, arguments in TINY_COMMANDS.items():
        ran = cli(*arguments, photo, *texts, *tiny_clip, "-f", "json", "--no-figures")
        assert ran.exit_code == 0, (command, ran.stderr)
        (entry,) = json.loads(ran.stdout)["results"]
        described = entry["result"]["target"]
        assert (described["kind"], described["text"], described["contrast_text"]) == ("text", "a dog", "a cat")
        assert described["scale"] > 0 and "scaled cosine" in described["score"], command
        assert "ttxt" in entry["experiment"]["name"], entry["experiment"]["name"]
        assert entry["experiment"]["settings"]["target"]["scale"] == described["scale"]  # bound before publishing
        scores[command] = described["clean_score"]
    assert len({round(score, 5) for score in scores.values()}) == 1, scores  # one score, however it is read
    ran = cli("patch", photo, newfoundland, "--sites", "attention", "--target-text", "a dog", *tiny_clip, "-f", "json")
    assert ran.exit_code == 0, ran.stderr
    metric = json.loads(ran.stdout)["results"][0]["result"]["metric"]
    assert metric["target"]["kind"] == "text" and metric["target"]["contrast_text"] is None


def test_a_text_longer_than_the_tokenizers_context_is_refused_before_loading(cli, photo, tiny_clip, no_loading):
    long = " ".join(["dog"] * 20)
    for option in (["--target-text", long], ["--target-text", "a dog", "--contrast-text", long]):
        refused = cli("explain", "--method", "gradient", photo, *option, *tiny_clip)
        assert refused.exit_code == 2, refused.stderr
        assert refused.stderr.count("\n") == 1
        for fragment in (f"{option[-2]}: 'dog dog", "is 22 tokens long", "reads at most 16", "shorten it"):
            assert fragment in refused.stderr, refused.stderr


def test_a_config_experiment_follows_a_text_target_instead_of_the_configs_class(tmp_path, newfoundland):
    import vitcli.cli  # noqa: F401  (registers every command, whose options a config's tables use)
    from vitcli.batch.config import load_config

    config = tmp_path / "run.toml"
    config.write_text(
        f'images = ["{newfoundland}"]\ntarget = "3"\n'
        '[[experiments]]\ncommand = "attribute"\ntarget-text = "a dog"\ncontrast-text = "a cat"\n'
    )
    (attribute,) = load_config(config).experiments
    assert "target" not in attribute.options
    (job,) = attribute.jobs
    assert (job.embedding_target.text, job.embedding_target.contrast_text) == ("a dog", "a cat")


def test_templates_apply_to_target_texts_as_to_zero_shot_labels(cli, photo, tiny_clip):
    """The text's embedding is CLIP's template recipe (mean of the templates' unit embeddings, renormalized), from
    open_clip's own encode_text; the JSON names the templates."""
    import json

    import open_clip
    import torch
    import torch.nn.functional as F  # noqa: N812
    from tiny_open_clip import TINY_CLIP

    from vitcli.loading import load_model
    from vitcli.spec import WeightsSpec

    templates = ["a photo of a {}.", "a drawing of a {}."]
    options = [option for template in templates for option in ("--template", template)]
    ran = cli("occlude-quadrants", photo, "--target-text", "dog", *options, *tiny_clip, "-f", "json")
    assert ran.exit_code == 0, ran.stderr
    described = json.loads(ran.stdout)["results"][0]["result"]["target"]
    assert described["templates"] == templates
    torch.manual_seed(0)
    reference = open_clip.create_model(TINY_CLIP, pretrained=None).eval()
    inputs = load_model(WeightsSpec(model_name=f"open_clip:{TINY_CLIP}", random=True), "cpu").prepare(photo).input
    tokenizer = open_clip.get_tokenizer(TINY_CLIP)
    with torch.no_grad():
        filled = F.normalize(reference.encode_text(tokenizer([t.format("dog") for t in templates])), dim=-1)
        text = F.normalize(filled.mean(dim=0), dim=-1)
        image = reference.encode_image(inputs[None])[0]
        expected = float(reference.logit_scale.exp() * F.cosine_similarity(image, text, dim=0))
    assert described["clean_score"] == pytest.approx(expected, abs=1e-5)


def test_the_python_api_takes_text_targets(photo):
    pytest.importorskip("open_clip")
    from tiny_open_clip import TINY_CLIP, register

    from vitcli import api
    from vitcli.loading import load_model
    from vitcli.spec import WeightsSpec

    register()
    model = load_model(WeightsSpec(model_name=f"open_clip:{TINY_CLIP}", random=True), "cpu")
    result = api.attribute(model, photo, target_text="a dog", contrast_text="a cat").to_dict()["result"]
    assert result["target"]["kind"] == "text" and result["target"]["contrast_text"] == "a cat"
    with pytest.raises(Exception, match="reads at most 16"):
        api.occlude_quadrants(model, photo, target_text=" ".join(["dog"] * 20))


def test_a_text_too_long_once_put_in_its_templates_exits_2_after_loading(cli, photo, tiny_clip):
    """Before loading the text is checked as given; put in --template's templates it is checked once the weights
    load, before any image: the refusal is still one line with exit 2, not a failure per image."""
    text = " ".join(["dog"] * 10)  # 12 tokens of 16
    template = ["--template", "a blurry photo of a {} on a beach."]
    refused = cli("occlude-quadrants", photo, photo, "--target-text", text, *template, *tiny_clip)
    assert refused.exit_code == 2, refused.stderr
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert "--target-text: 'a blurry photo of a dog" in refused.stderr and "reads at most 16" in refused.stderr


@pytest.mark.slow
def test_on_a_siglip_pair_the_text_score_is_its_scaled_cosine_and_ig_is_complete(photo, siglip):
    """A SigLIP-like pair (timm trunk pooled by attention, tests/tiny_open_clip.py): the score is scale x cosine of
    open_clip's own encode_image and encode_text (its logit without the constant bias), and IG is complete."""
    import torch

    from vitcli.experiments.explain import explain
    from vitcli.experiments.explain_options import GradientOptions
    from vitcli.experiments.occlusion import fill_image

    model, reference, tokenizer = siglip
    prepared = model.prepare(photo)
    steps = 32
    target = text_target(model, DOG, CAT)
    result = explain(model, prepared, ["ig"], gradient_options=GradientOptions(ig_steps=steps), embedding=target)
    ends = torch.stack([prepared.input, fill_image(model, prepared, "gray")])
    scores = own_scores(reference, tokenizer, ends, [DOG, CAT])
    score, baseline_score = (scores[:, 0] - scores[:, 1]).tolist()
    check = result.maps[0].attribution.completeness
    assert result.target.score == pytest.approx(score, abs=1e-5)
    assert check.score == pytest.approx(score, abs=1e-5)
    assert check.baseline_score == pytest.approx(baseline_score, abs=1e-5)
    assert check.relative_error < 0.2


def test_a_run_config_refuses_a_text_too_long_in_its_templates_once_not_per_image(cli, tmp_path, photo, tiny_clip):
    """`vitcli run` binds its experiments' targets right after loading too: exit 2, one line."""
    import json

    from tiny_open_clip import TINY_CLIP

    config = tmp_path / "texts.toml"
    config.write_text(
        f"images = [{json.dumps(str(photo))}, {json.dumps(str(photo))}]\n"
        f'[model]\nname = "open_clip:{TINY_CLIP}"\nweights = "random"\n'
        'templates = ["a blurry photo of a {} on a beach."]\n'
        f'[[experiments]]\ncommand = "occlude-quadrants"\ntarget-text = "{" ".join(["dog"] * 10)}"\n',
        encoding="utf-8",
    )
    refused = cli("run", config, "--no-figures", "--device", "cpu", "-o", tmp_path / "out")
    assert refused.exit_code == 2, refused.stderr
    assert refused.stderr.count("\n") == 1 and "reads at most 16" in refused.stderr, refused.stderr


@pytest.mark.parametrize("by", ["block", "head", "token"])
def test_on_a_siglip_pair_the_decomposition_rebuilds_the_text_score(photo, siglip, by):
    """Attention pooling (SigLIP's map head) with a text target: blocks, heads or tokens, the pooling MLP's term and
    the constant add up to open_clip's own scale x cosine(encode_image, encode_text) difference within 1e-4."""
    from vitcli.experiments.attribution import attribute

    model, reference, tokenizer = siglip
    prepared = model.prepare(photo)
    scores = own_scores(reference, tokenizer, prepared.input[None], [DOG, CAT])[0]
    result = attribute(model, prepared, None, None, by, 12 if by == "token" else None, text_target(model, DOG, CAT))
    expected = float(scores[0] - scores[1])
    assert result.model_metric == pytest.approx(expected, abs=1e-5)
    assert abs(result.reconstruction - expected) < 1e-4
    assert result.pool_mlp is not None


def test_the_text_conditioned_dla_map_sits_beside_gradcam_and_ig(cli, photo, tiny_clip):
    """`explain --method dla,gradcam,ig --target-text T`: three maps of one text score, the dla map's identity
    holding for it (its decomposition rebuilds the score every other method reads)."""
    import json

    ran = cli(
        "explain", photo, "-M", "dla", "-M", "gradcam", "-M", "ig", "--target-text", "a dog", *tiny_clip,
        "-f", "json", "--no-figures",
    )  # fmt: skip
    assert ran.exit_code == 0, ran.stderr
    result = json.loads(ran.stdout)["results"][0]["result"]
    assert [item["method"] for item in result["maps"]] == ["dla", "gradcam", "ig"]
    decomposition = result["maps"][0]["decomposition"]
    assert decomposition["model_metric"] == pytest.approx(result["target"]["clean_score"], abs=1e-5)
    assert decomposition["abs_difference"] < 1e-4
    ig = result["maps"][2]["completeness"]
    assert ig["score"] == pytest.approx(result["target"]["clean_score"], abs=1e-5)
