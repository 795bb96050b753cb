"""timm Swin against every command: each runs (exit 0) or is refused in one line (exit 2) as docs/models.md's table
says, on `test_swin`, a Swin Transformer cut down to 2 blocks per stage and width 32 (2.5 M parameters) that keeps the
224 input, 4-pixel patches and 7x7 windows, so its stages' grids are 56x56, 28x28, 14x14 and 7x7 as in Swin-T."""

from __future__ import annotations

import json

import pytest
from timm.models import register_model
from timm.models.swin_transformer import _create_swin_transformer

from conftest import RANDOM_CPU, result_files

SWIN = "test_swin"


@register_model
def test_swin(pretrained: bool = False, **kwargs):  # registered with timm under its name: `--model test_swin`
    """Swin-T's stages, windows and patch size at width 32 with 1, 2, 4 and 8 heads and two blocks per stage (one
    plain, one shifted); Swin-T's pretrained configuration (ImageNet classes) without its weights."""
    dimensions = dict(patch_size=4, window_size=7, embed_dim=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8))
    return _create_swin_transformer("swin_tiny_patch4_window7_224", pretrained, **dict(dimensions, **kwargs))


test_swin.__test__ = False  # a model constructor, not a test


@pytest.fixture(scope="module")
def pets(tmp_path_factory):
    """An ImageFolder of two classes, three rotated copies of each example photo."""
    from PIL import Image

    from conftest import EXAMPLES

    root = tmp_path_factory.mktemp("pets")
    for name, source in (("dog", "newfoundland_31.jpg"), ("cat", "Persian_98.jpg")):
        (root / name).mkdir()
        image = Image.open(EXAMPLES / source).convert("RGB")
        for index in range(3):
            image.rotate(5 * index).save(root / name / f"{name}{index}.jpg", quality=90)
    return root


@pytest.mark.slow
@pytest.mark.parametrize(
    ("key", "arguments"),
    [
        ("predict", ["predict"]),
        ("patches", ["patches"]),
        ("attend", ["attend", "--block", "4", "--query", "74", "--all-heads"]),
        ("attend --view summary", ["attend", "--view", "summary"]),
        ("attend --view all-blocks", ["attend", "--view", "all-blocks", "--query", "1"]),
        ("attend --view rollout", ["attend", "--view", "rollout", "--query", "1"]),
        ("occlude-quadrants", ["occlude-quadrants"]),
        ("occlude-patches", ["occlude-patches"]),
        ("trace", ["trace", "--token", "1"]),
        ("compare", ["compare", "{other}"]),
        ("explain", ["explain", "--method", "gradient", "--method", "gradcam", "--method", "occlusion"]),
        ("explain", ["explain", "--method", "ig", "--ig-steps", "4", "--method", "smoothgrad", "--samples", "2"]),
        ("explain", ["explain", "--method", "gradient", "--faithfulness", "--steps", "4", "--random-orders", "1"]),
        ("explain --method attention", ["explain", "--method", "attention"]),
        ("explain --method rollout", ["explain", "--method", "rollout"]),
        ("explain --method relevance", ["explain", "--method", "relevance"]),
        ("explain --method grad-rollout", ["explain", "--method", "grad-rollout"]),
        ("explain --method dla", ["explain", "--method", "dla"]),
        ("lens", ["lens"]),
        ("attribute", ["attribute", "--by", "block"]),
        ("attribute --by head", ["attribute", "--by", "head"]),
        ("attribute --by token", ["attribute", "--by", "token", "--block", "8"]),
        ("ablate", ["ablate"]),
        (
            "ablate",
            ["ablate", "--heads", "4.2,8.7", "--blocks", "3.attn,8.mlp", "--mode", "mean", "--reference", "{other}"],
        ),
        ("patch", ["patch", "{other}"]),
        ("explore", ["explore"]),
        ("anatomy --view filters", ["anatomy", "--view", "filters"]),
        ("anatomy --view positions", ["anatomy", "--view", "positions"]),
        ("anatomy --view distance", ["anatomy", "--view", "distance"]),
        ("anatomy --view cka", ["anatomy", "--view", "cka"]),
        ("anatomy --view pca", ["anatomy", "--view", "pca"]),
        ("anatomy --view norms", ["anatomy", "--view", "norms"]),
    ],
    ids=lambda value: value if isinstance(value, str) else " ".join(value[1:5]),
)
def test_every_command_on_swin_runs_or_is_refused_as_the_table_says(cli, newfoundland, persian, key, arguments):
    from vitcli.capture.support import facts_of, missing_features
    from vitcli.loading import require_vit

    missing = missing_features(key, facts_of(require_vit(SWIN)).features)
    rest = [argument.format(other=newfoundland) for argument in arguments[1:]]
    result = cli(arguments[0], persian, *rest, "--model", SWIN, *RANDOM_CPU, "-q")
    if missing:
        assert result.exit_code == 2 and f"`{key}` needs what {SWIN}" in result.stderr, result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
    else:
        assert result.exit_code == 0, result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("arguments", [["compare-patch-size"], ["compare-patch-size", "--adapt", "{image}"]])
def test_compare_patch_size_refuses_swin_before_loading(cli, persian, arguments):
    """Its closed form counts attention over one grid of tokens in every block; Swin attends in windows on four."""
    result = cli(*[argument.format(image=persian) for argument in arguments], "--model", SWIN, *RANDOM_CPU)
    key = " ".join(arguments[:2]).replace(" {image}", "")
    assert result.exit_code == 2, result.stderr
    assert f"`{key}` needs what {SWIN} (timm SwinTransformer) lacks: no single token grid" in result.stderr


@pytest.mark.slow
def test_probe_on_swin_writes_a_checkpoint_that_predict_loads_with_the_new_classes(cli, workdir, pets, persian):
    """Seen to fail (an internal error, KeyError 'cls_token') before the probe's checkpoint named Swin's head.fc."""
    result = cli("probe", pets, "--model", SWIN, *RANDOM_CPU, "--val-fraction", "0", "-q")
    assert result.exit_code == 0, result.stderr
    name = "probe-vf0-ss0-wd0.0001"
    document = json.loads(result_files(workdir / "outputs", name)["json"].read_text())
    checkpoint = result_files(workdir / "outputs", f"{name}-checkpoint")
    image = pets / "cat" / "cat1.jpg"
    predicted = cli("predict", image, "--model", SWIN, "--checkpoint", checkpoint["safetensors"],
                    "--device", "cpu", "-k", "2", "-f", "json", "-q")  # fmt: skip
    assert predicted.exit_code == 0, predicted.stderr
    top = json.loads(predicted.stdout)["results"][0]["result"]["top"]
    assert {entry["label"] for entry in top} == {"cat", "dog"}
    expected = next(row for row in document["result"]["images"] if row["path"].endswith("cat1.jpg"))
    assert top[0]["label"] == expected["predicted"]


@pytest.mark.slow
def test_ablate_all_heads_on_swin_takes_each_stage_heads(cli, persian):
    """Seen to fail before the heads were read per block: `--heads all` took block 1's one head in every block, and
    `--heads 8.8` was refused ("each block has heads 1..1")."""
    from vitcli.capture import family_of
    from vitcli.loading import require_vit

    places = family_of(require_vit(SWIN)).places()
    result = cli("ablate", persian, "--model", SWIN, *RANDOM_CPU, "--heads", "all", "-f", "json", "-q")
    assert result.exit_code == 0, result.stderr
    ablated = {row["ablated"] for row in json.loads(result.stdout)["results"][0]["result"]["ablations"]}
    assert ablated == {f"{place.number}.{head}" for place in places for head in range(1, place.heads + 1)}
    assert cli("ablate", persian, "--model", SWIN, *RANDOM_CPU, "--heads", "8.8", "-q").exit_code == 0
    refused = cli("ablate", persian, "--model", SWIN, *RANDOM_CPU, "--heads", "3.3")
    assert refused.exit_code == 2 and "--heads 3.3: head 3 does not exist; block 3 has heads 1..2" in refused.stderr


@pytest.mark.slow
def test_attribution_by_block_on_swin_sums_the_last_stage_to_the_logit(persian):
    """On random Swin weights with every parameter moved off its initial value (norm scales and biases included),
    the rows entering the last stage and its blocks' attention and MLP terms plus the constant give the model's own
    logit within 1e-4; the entering and block-8 MLP terms match the frozen-scale readout computed here from hooks on
    timm's modules (the last stage's input and the MLP's output), not from vitcli's sites."""
    import timm
    import torch

    from vitcli.experiments.attribution import EMBEDDING, attribute
    from vitcli.model import VitModel
    from vitcli.spec import WeightsSpec

    torch.manual_seed(0)
    net = timm.create_model(SWIN, pretrained=False).eval()
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    model = VitModel(net, WeightsSpec(model_name=SWIN, random=True, seed=0), torch.device("cpu"), 8)
    prepared = model.prepare(persian)
    kept = {}
    stage = net.layers[-1]
    handles = [
        stage.blocks[0].register_forward_pre_hook(lambda _m, args: kept.setdefault("entering", args[0])),
        stage.blocks[1].mlp.register_forward_hook(lambda _m, _a, output: kept.setdefault("mlp", output)),
        net.norm.register_forward_pre_hook(lambda _m, args: kept.setdefault("final", args[0])),
    ]
    try:
        with torch.no_grad():
            logits = net(prepared.input[None]).double()[0]
    finally:
        for handle in handles:
            handle.remove()
    target = int(logits.argmax())
    result = attribute(model, prepared, None, None, "block")

    assert result.first_block == 7
    assert [(term.component, term.block) for term in result.terms] == [
        (EMBEDDING, None),
        ("attn", 7),
        ("mlp", 7),
        ("attn", 8),
        ("mlp", 8),
    ]
    assert result.constant != 0.0
    assert abs(result.reconstruction - float(logits[target])) < 1e-4

    final = kept["final"].double().flatten(1, 2)[0]  # (49, C): the rows the final LayerNorm normalizes
    deviation = (final.var(-1, unbiased=False) + net.norm.eps).sqrt()
    read = (net.norm.weight * net.head.fc.weight[target]).detach().double()

    def readout(component: torch.Tensor) -> float:
        rows = component.double().reshape(final.shape)
        centred = rows - rows.mean(-1, keepdim=True)
        return float(((centred / deviation[:, None]) @ read).mean())

    assert result.terms[0].value == pytest.approx(readout(kept["entering"]), abs=1e-6)
    assert result.terms[4].value == pytest.approx(readout(kept["mlp"]), abs=1e-6)


@pytest.mark.slow
def test_attribute_on_swin_says_its_terms_start_at_the_last_stage(cli, persian):
    result = cli("attribute", persian, "--model", SWIN, *RANDOM_CPU, "--target-feature", "3", "-f", "json", "-q")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)["results"][0]["result"]
    assert document["first_block"] == 7
    assert "final rows = the rows entering block 7 (the last stage's input" in document["definition"]
    assert "MLP outputs of blocks 7..8 (layer scale applied)" in document["definition"]
    assert "earlier blocks reach the last stage only through patch merging" in document["definition"]
    assert [term["name"] for term in document["terms"]] == ["entering 7", "7.attn", "7.mlp", "8.attn", "8.mlp"]
    assert document["reconstruction"]["abs_difference"] < 1e-4
