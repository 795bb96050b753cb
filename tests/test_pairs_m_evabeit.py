"""Every command on timm's Eva (EVA-02, with and without a classifier head) and Beit runs or is refused in one line as
docs/models.md's table says; the lens and compare read what these heads read (the mean of the patch rows).

The models are the real timm architectures cut down (2 blocks of width 64 with 2 heads, a 4x4 grid) and registered
with timm under their own names, so the CLI builds them by name with `--weights random`."""

from __future__ import annotations

import json

import pytest
import torch
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.beit import Beit
from timm.models.eva import Eva

from conftest import RANDOM_CPU, result_files


def _cfg(size: int, classes: int) -> dict:
    return {
        "url": "",
        "num_classes": classes,
        "input_size": (3, size, size),
        "pool_size": None,
        "crop_pct": 0.9,
        "interpolation": "bicubic",
        "mean": (0.5, 0.5, 0.5),
        "std": (0.5, 0.5, 0.5),
        "first_conv": "patch_embed.proj",
        "classifier": "head",
    }


# register_model reads the pretrained cfgs of its module's `default_cfgs`.
default_cfgs = generate_default_cfgs(
    {"pairs_beit": _cfg(64, 10), "pairs_eva": _cfg(56, 10), "pairs_eva_headless": _cfg(56, 0)}
)


@register_model
def pairs_beit(pretrained: bool = False, **kwargs) -> Beit:
    """BEiT as beit_base_patch16_224 (relative bias per block, layer scale, average pooling), cut down."""
    arguments = dict(img_size=64, patch_size=16, embed_dim=64, depth=2, num_heads=2, mlp_ratio=2, num_classes=10)
    arguments |= dict(use_abs_pos_emb=False, use_rel_pos_bias=True, init_values=0.1)
    return build_model_with_cfg(Beit, "pairs_beit", pretrained, **(arguments | kwargs))


def _eva(name: str, classes: int, pretrained: bool, kwargs: dict) -> Eva:
    """EVA-02 as eva02_tiny_patch14_224 (RoPE, SwiGLU, average pooling), cut down."""
    arguments = dict(img_size=56, patch_size=14, embed_dim=64, depth=2, num_heads=2, mlp_ratio=4 * 2 / 3)
    arguments |= dict(swiglu_mlp=True, use_rot_pos_emb=True, ref_feat_shape=(4, 4), num_classes=classes)
    return build_model_with_cfg(Eva, name, pretrained, **(arguments | kwargs))


@register_model
def pairs_eva(pretrained: bool = False, **kwargs) -> Eva:
    return _eva("pairs_eva", 10, pretrained, kwargs)


@register_model
def pairs_eva_headless(pretrained: bool = False, **kwargs) -> Eva:
    return _eva("pairs_eva_headless", 0, pretrained, kwargs)


MODELS = ["pairs_beit", "pairs_eva", "pairs_eva_headless"]


def _final_rows(model, photo) -> torch.Tensor:
    """The last block's output rows, by a hook this test puts on the net itself."""
    kept = []
    handle = model.net.blocks[-1].register_forward_hook(lambda _m, _i, output: kept.append(output))
    try:
        with torch.no_grad():
            model.net(model.prepare(photo).input[None])
    finally:
        handle.remove()
    return kept[0]


@pytest.mark.parametrize("name", ["pairs_beit", "pairs_eva"])
def test_lens_reads_the_cls_row_and_the_patch_mean_the_model_pools(cli, photo, workdir, name):
    """Seen failing before: the "CLS" readout was forward_head's, which on these average-pooling heads is the mean
    of the patch rows. Now the CLS readout after the last block is the head on row 0 (1e-7 in probability), and the
    patch mean readout, the model's own, is its probabilities."""
    from vitcli.loading import load_model
    from vitcli.spec import WeightsSpec

    result = cli("lens", photo, "--model", name, "-f", "json", *RANDOM_CPU)
    assert result.exit_code == 0, result.stderr
    (document,) = json.loads(result.stdout)["results"]
    assert document["result"]["own_readout"] == "patch mean"
    last = [row for row in document["result"]["readouts"] if row["block"] == 2]
    by_readout = {row["readout"]: row for row in last}
    model = load_model(WeightsSpec(model_name=name, random=True, seed=0), "cpu")
    target = by_readout["CLS"]["target_class"]
    net, rows = model.net, _final_rows(model, photo)
    with torch.no_grad():
        cls_p = net.head(net.fc_norm(net.norm(rows)[:, 0])).softmax(-1)[0, target]
        own_p = net(model.prepare(photo).input[None]).softmax(-1)[0, target]
    assert by_readout["CLS"]["target_probability"] == pytest.approx(float(cls_p), abs=1e-7)
    assert by_readout["patch mean"]["target_probability"] == pytest.approx(float(own_p), abs=1e-7)
    assert abs(float(cls_p - own_p)) > 1e-5  # 100 x the tolerance: the test tells the two readouts apart


def test_compare_runs_on_beit_and_its_readout_is_the_models_logit(cli, photo, newfoundland, workdir):
    """Seen failing before (exit 1, "vitcli reads one linear head on timm's ViT"): compare reads Beit's head input
    (fc_norm of the patch mean) and its recomputed readout holds to the model's logits."""
    result = cli("compare", photo, newfoundland, "--model", "pairs_beit", *RANDOM_CPU)
    assert result.exit_code == 0, result.stderr
    (path,) = workdir.glob("outputs/*/*/compare-*.json")
    checks = json.loads(path.read_text())["result"]["checks"]
    assert checks["max_abs_error_readout_vs_model_logit"] < 1e-6
    assert checks["max_abs_error_own_pooling_vs_model_logits"] < 1e-6


@pytest.mark.parametrize("name", ["pairs_beit", "pairs_eva"])
def test_patches_runs_to_the_rows_entering_block_1(cli, photo, workdir, name):
    """Seen failing before (an internal error: the trace read timm ViT's dynamic_img_size and patch_drop): the row
    entering block 1 is the projection plus the position row (BEiT: none, its table is zeros)."""
    result = cli("patches", photo, "--model", name, "--patch", "6", *RANDOM_CPU)
    assert result.exit_code == 0, result.stderr
    document = json.loads(result_files(workdir / "outputs", "patches-p6-v8")["json"].read_text())["result"]
    (detail,) = document["selected"]
    summed = torch.tensor(detail["projection"]) + torch.tensor(detail["position_embedding"])
    assert torch.allclose(summed, torch.tensor(detail["block1_input"]), atol=1e-5)


# The key of COMMAND_NEEDS each run is checked against, and its arguments after the image ({other}: a second image,
# {folder}: a folder of images, {target}: an embedding target on the headless model, where the command takes one).
PAIRS = [
    ("predict", ["predict"]),
    ("patches", ["patches"]),
    ("attend", ["attend", "--block", "2", "--head", "1"]),
    ("attend --view summary", ["attend", "--view", "summary"]),
    ("attend --view all-blocks", ["attend", "--view", "all-blocks", "--all-heads"]),
    ("attend --view rollout", ["attend", "--view", "rollout"]),
    ("occlude-quadrants", ["occlude-quadrants", "{target}"]),
    ("occlude-patches", ["occlude-patches", "{target}"]),
    ("trace", ["trace"]),
    ("compare", ["compare", "{other}"]),
    ("explain", ["explain", "--method", "gradient", "--method", "gradcam", "--method", "occlusion", "{target}"]),
    ("explain --method attention", ["explain", "--method", "attention", "{target}"]),
    ("explain --method rollout", ["explain", "--method", "rollout", "--method", "relevance", "{target}"]),
    ("explain --method grad-rollout", ["explain", "--method", "grad-rollout", "{target}"]),
    ("explain --method dla", ["explain", "--method", "dla", "{target}"]),
    ("explain --method relevance", ["explain", "--faithfulness", "{target}"]),  # its default methods include these
    ("lens", ["lens"]),
    ("attribute", ["attribute", "--by", "block", "{target}"]),
    ("attribute --by head", ["attribute", "--by", "head", "{target}"]),
    ("attribute --by token", ["attribute", "--by", "token", "--block", "2", "{target}"]),
    ("ablate", ["ablate", "{target}"]),
    ("patch", ["patch", "{other}", "{target}"]),
    ("compare-patch-size", ["compare-patch-size"]),
    ("compare-patch-size --adapt", ["compare-patch-size", "--adapt", "{image}"]),
    ("probe", ["probe"]),
    ("explore", ["explore"]),
    ("explore --explain", ["explore", "--explain"]),
    ("anatomy --view filters", ["anatomy", "--view", "filters"]),
    ("anatomy --view positions", ["anatomy", "--view", "positions"]),
    ("anatomy --view distance", ["anatomy", "--view", "distance"]),
    ("anatomy --view cka", ["anatomy", "{folder}", "--view", "cka"]),
    ("anatomy --view pca", ["anatomy", "--view", "pca"]),
    ("anatomy --view norms", ["anatomy", "--view", "norms"]),
]
TARGET = ("--target-feature", "0")


@pytest.fixture(scope="module")
def folders(tmp_path_factory, photo, newfoundland):
    """A flat folder of 4 images (anatomy's CKA needs 4) and an ImageFolder of two classes of 2 (probe)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("sets")
    for folder in ("flat", "classes/c0", "classes/c1"):
        (root / folder).mkdir(parents=True)
    for index, source in enumerate([photo, newfoundland, photo, newfoundland]):
        image = Image.open(source).convert("RGB").rotate(5 * index)
        image.save(root / "flat" / f"{index}.jpg")
        image.save(root / "classes" / f"c{index % 2}" / f"{index}.jpg")
    return root


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("key, arguments", PAIRS, ids=[key for key, _ in PAIRS])
def test_every_pair_runs_or_is_refused_as_the_table_says(
    cli, photo, newfoundland, folders, monkeypatch, model, key, arguments
):
    """The table's answer (the family's features against COMMAND_NEEDS) is what the command does: exit 0, or exit 2
    in one line naming the command and the model, before any weights load."""
    import vitcli.loading
    from vitcli.capture.support import facts_of, missing_features
    from vitcli.loading import require_vit

    has_target = model == "pairs_eva_headless" and "{target}" in arguments
    missing = missing_features(key, facts_of(require_vit(model)).features, has_target)
    values = {"{other}": [newfoundland], "{folder}": [], "{image}": [photo], "{target}": TARGET if has_target else []}
    rest = [value for argument in arguments[1:] for value in values.get(argument, [argument])]
    subject = {"probe": [folders / "classes"], "compare-patch-size": []}.get(arguments[0], [photo])
    if "{folder}" in arguments:
        subject = [folders / "flat"]
    if missing:
        monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    result = cli(arguments[0], *subject, *rest, "--model", model, *RANDOM_CPU)
    if missing:
        assert result.exit_code == 2, result.stderr
        assert result.stderr.startswith(f"error: `{key}` needs what {model}") and result.stderr.count("\n") == 1
    else:
        assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize(
    "arguments, fragment",
    [
        (["lens", "--model", "vit_medium_patch16_gap_256"], "lacks: no class token"),
        (
            ["compare-patch-size", "--model", "beit_base_patch16_224"],
            "lacks: no timm standard blocks (Block, Attention, Mlp)",
        ),
        (
            ["compare-patch-size", "--model", "eva02_tiny_patch14_224"],
            "lacks: no timm standard blocks (Block, Attention, Mlp)",
        ),
    ],
    ids=["lens without CLS", "compare-patch-size on BEiT", "compare-patch-size on EVA-02"],
)
def test_what_these_commands_cannot_read_is_refused_before_loading(cli, photo, monkeypatch, arguments, fragment):
    """Seen failing before: lens on a mean-pooled ViT without a class token ran, calling the mean readout "CLS";
    compare-patch-size on BEiT and EVA-02 was refused only by its own check, while the table said it runs."""
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    image = [] if arguments[0] == "compare-patch-size" else [photo]
    result = cli(arguments[0], *image, *arguments[1:], *RANDOM_CPU)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith(f"error: `{arguments[0]}` needs what {arguments[2]}") and fragment in result.stderr
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("name", ["pairs_beit", "pairs_eva"])
def test_explain_attention_is_the_cls_row_the_module_computed(cli, photo, workdir, name):
    """Seen failing before (exit 1, "the explicit forward follows timm's ViT"): explain --method attention on these
    families reads the captured pattern; its map is block 2's CLS row at attn_drop on the non-fused path (what the
    block multiplies v by: BEiT's relative bias, EVA-02's RoPE included), mean over heads, patch sources (1e-6)."""
    from vitcli.loading import load_model
    from vitcli.spec import WeightsSpec

    result = cli("explain", photo, "--method", "attention", "--block", "2", "--model", name, *RANDOM_CPU)
    assert result.exit_code == 0, result.stderr
    (path,) = workdir.glob("outputs/*/*/explain-mattention-*.json")
    (shown,) = json.loads(path.read_text())["result"]["maps"]
    model = load_model(WeightsSpec(model_name=name, random=True, seed=0), "cpu")
    attention, kept = model.net.blocks[1].attn, []
    handle = attention.attn_drop.register_forward_hook(lambda _m, _i, output: kept.append(output))
    fused, attention.fused_attn = attention.fused_attn, False
    try:
        with torch.no_grad():
            model.net(model.prepare(photo).input[None])
    finally:
        attention.fused_attn = fused
        handle.remove()
    expected = kept[0][0, :, 0, 1:].mean(dim=0).reshape(4, 4)
    assert torch.allclose(torch.tensor(shown["values"]), expected, atol=1e-6)
