"""Hugging Face `transformers` ViTs through `--model hf:FOLDER`: tiny random models saved with save_pretrained, each
checked against transformers' own forward with `output_attentions=True`."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from vitcli.capture import caching, family_of, hooks  # noqa: E402
from vitcli.spec import WeightsSpec  # noqa: E402

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8)
LABELS = {0: "cat", 1: "dog", 2: "<b>fox</b>"}
MODELS = {
    "ViTForImageClassification": lambda: transformers.ViTConfig(
        intermediate_size=128, num_labels=3, id2label=LABELS, label2id={v: k for k, v in LABELS.items()}, **TINY
    ),
    "ViTModel": lambda: transformers.ViTConfig(intermediate_size=128, **TINY),
    "Dinov2Model": lambda: transformers.Dinov2Config(**TINY),
    "Dinov2WithRegistersModel": lambda: transformers.Dinov2WithRegistersConfig(num_register_tokens=2, **TINY),
    "CLIPVisionModel": lambda: transformers.CLIPVisionConfig(intermediate_size=128, **TINY),
}
PREFIX = {"Dinov2WithRegistersModel": ("CLS", "R1", "R2")}  # the others: ("CLS",)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """One folder per supported class, saved with save_pretrained from seeded random weights."""
    saved = {}
    for index, (name, config) in enumerate(MODELS.items()):
        torch.manual_seed(index)
        folder = tmp_path_factory.mktemp(name)
        getattr(transformers, name)(config()).save_pretrained(folder)
        saved[name] = folder
    return saved


def own_model(folder, name):
    return getattr(transformers, name).from_pretrained(folder, attn_implementation="eager").eval()


def load(folder):
    from vitcli.loading import load_model

    return load_model(WeightsSpec(model_name=f"hf:{folder}"), "cpu")


@pytest.mark.parametrize("name", MODELS)
def test_output_and_every_blocks_pattern_equal_transformers_own(folders, name):
    model = load(folders[name])
    reference = own_model(folders[name], name)
    inputs = torch.randn(2, 3, 32, 32)
    sites = [f"blocks.{block}.attn.hook_pattern" for block in (1, 2)]
    with torch.no_grad():
        own = reference(pixel_values=inputs, output_attentions=True)
        with caching(model.net, sites) as cache:
            output = model.net(inputs)
    if name == "ViTForImageClassification":
        expected = own.logits
    elif name == "ViTModel":  # its pooler (dense + tanh) is not the embedding: the class token after the final norm
        expected = own.last_hidden_state[:, 0]
    else:
        expected = own.pooler_output
    if name == "ViTForImageClassification":
        assert output.shape == (2, 3)
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=1e-5)
    for block, site in enumerate(sites):
        tokens = len(PREFIX.get(name, ("CLS",))) + 16
        assert cache[site].shape == (2, 2, tokens, tokens)
        torch.testing.assert_close(cache[site], own.attentions[block], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_sites_add_up_and_a_head_zeroed_at_z_equals_the_weight_edit(folders, name):
    model = load(folders[name])
    family = family_of(model.net)
    inputs = torch.randn(2, 3, 32, 32)
    kinds = ("hook_resid_pre", "attn.hook_pattern", "attn.hook_v", "attn.hook_z", "hook_attn_out", "hook_mlp_out")
    sites = [f"blocks.2.{kind}" for kind in (*kinds, "hook_resid_post")]
    with torch.no_grad():
        with caching(model.net, sites) as cache:
            output = family.forward(inputs)
        resid_pre, pattern, v, z, attn_out, mlp_out, resid_post = (cache[site] for site in sites)
        torch.testing.assert_close(torch.einsum("bhqk,bkhd->bqhd", pattern, v), z, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(resid_pre + attn_out + mlp_out, resid_post, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(family.run_from(2, resid_pre), output, atol=1e-6, rtol=1e-5)

        def zero_head_2(heads):
            return torch.cat((heads[:, :, :1], torch.zeros_like(heads[:, :, 1:])), dim=2)

        with hooks(model.net, {"blocks.2.attn.hook_z": zero_head_2}):
            ablated = family.forward(inputs)
        projection = family.blocks()[1].get_submodule(family.layout.attention + "." + family.layout.out_proj)
        kept = projection.weight.detach().clone()
        projection.weight.data[:, 32:] = 0
        edited = family.forward(inputs)
        projection.weight.data.copy_(kept)
    torch.testing.assert_close(ablated, edited, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(ablated, output)


def test_grid_tokens_and_pooling(folders):
    for name, folder in folders.items():
        family = family_of(load(folder).net)
        grid = family.grid()
        assert (grid.rows, grid.cols, grid.prefix_names) == (4, 4, PREFIX.get(name, ("CLS",)))
        assert family.pooling == "token"
        assert family.num_classes == (3 if name == "ViTForImageClassification" else 0)
        assert family.pooled(torch.zeros(1, 3, 32, 32)).shape == (1, 64)


def test_preprocessing_follows_the_folders_image_processor(folders, tmp_path, persian):
    """The folder's preprocessor_config.json sets size, crop, resampling, mean and std: vitcli's input equals the
    image processor's pixel values within one level of 255 (PIL's resize against torchvision's)."""
    import shutil

    from PIL import Image

    processors = {
        "squash": transformers.ViTImageProcessor(size={"height": 40, "width": 48}),
        "crop": transformers.CLIPImageProcessor(size={"shortest_edge": 40}, crop_size={"height": 32, "width": 32}),
    }
    for kind, processor in processors.items():
        folder = tmp_path / kind
        shutil.copytree(folders["ViTForImageClassification"], folder)
        processor.save_pretrained(folder)
        model = load(folder)
        expected = transformers.AutoImageProcessor.from_pretrained(folder)(
            images=Image.open(persian).convert("RGB"), return_tensors="pt"
        )
        pixels = (model.prepare(persian).input - expected.pixel_values[0]) * torch.tensor(model.std)[:, None, None]
        assert pixels.abs().max() * 255 <= 1 + 1e-4, kind
        assert model.grid.rows * model.grid.patch_size == expected.pixel_values.shape[-2]


def test_without_a_preprocessor_config_the_documented_defaults_apply(folders):
    expected = {
        "ViTModel": ("bilinear", (0.5, 0.5, 0.5)),
        "Dinov2Model": ("bicubic", (0.485, 0.456, 0.406)),
        "CLIPVisionModel": ("bicubic", (0.48145466, 0.4578275, 0.40821073)),
    }
    for name, (interpolation, mean) in expected.items():
        config = load(folders[name]).data_config
        assert (config["input_size"], config["interpolation"], tuple(config["mean"])) == (
            (3, 32, 32),
            interpolation,
            mean,
        )


def test_random_weights_are_seeded_from_the_folders_config(folders):
    from vitcli.loading import load_model

    name = f"hf:{folders['ViTModel']}"
    first, again = (load_model(WeightsSpec(model_name=name, random=True, seed=seed), "cpu") for seed in (3, 3))
    other = load_model(WeightsSpec(model_name=name, random=True, seed=4), "cpu")
    assert first.parameter_sha256 != load(folders["ViTModel"]).parameter_sha256 != other.parameter_sha256
    assert first is again


def test_predict_runs_end_to_end_with_the_configs_labels(cli, folders, photo):
    result = cli("predict", photo, "--model", f"hf:{folders['ViTForImageClassification']}", "--format", "json")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    labels = [row["label"] for row in record["results"][0]["result"]["top"]]
    assert sorted(labels) == sorted(LABELS.values())
    assert "Loading weights" not in result.stderr


def test_a_timm_model_never_imports_transformers_or_open_clip():
    code = (
        "import sys; from vitcli.loading import load_model; from vitcli.spec import WeightsSpec; "
        "load_model(WeightsSpec(model_name='vit_tiny_patch16_224', random=True), 'cpu'); "
        "print(sorted(set(sys.modules) & {'transformers', 'open_clip'}))"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


# ----- bad inputs: one line, exit 2, before any weights load


@pytest.fixture
def no_loading(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr("vitcli.loading_towers.load_tower", refuse)


def refused(cli, *args):
    result = cli("predict", *args)
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_a_missing_folder_is_refused(cli, tmp_path, no_loading):
    line = refused(cli, "--model", f"hf:{tmp_path / 'nowhere'}")
    assert "does not exist" in line and "save_pretrained" in line


def test_a_folder_without_config_is_refused(cli, tmp_path, no_loading):
    line = refused(cli, "--model", f"hf:{tmp_path}")
    assert "holds no config.json" in line


def test_a_folder_of_another_class_is_refused(cli, tmp_path, no_loading):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "vit", "architectures": ["ViTForMaskedImageModeling"]})
    )
    line = refused(cli, "--model", f"hf:{tmp_path}")
    assert "ViTForMaskedImageModeling" in line and "ViTForImageClassification" in line


def test_a_folder_without_weights_is_refused_unless_random(cli, folders, tmp_path, no_loading):
    (tmp_path / "config.json").write_bytes((folders["ViTForImageClassification"] / "config.json").read_bytes())
    line = refused(cli, "--model", f"hf:{tmp_path}")
    assert "holds no weights" in line and "--weights random" in line


def test_a_checkpoint_with_an_hf_folder_is_refused(cli, folders, tmp_path, no_loading):
    checkpoint = tmp_path / "weights.pth"
    checkpoint.write_bytes(b"")
    line = refused(cli, "--model", f"hf:{folders['ViTModel']}", "--checkpoint", checkpoint)
    assert "takes its weights from the folder" in line


def test_without_transformers_the_pip_command_is_named(cli, tmp_path, monkeypatch, no_loading):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    line = refused(cli, "--model", f"hf:{tmp_path / 'any'}")
    assert "pip install 'vitcli[hf]'" in line


def test_occlusions_forward_is_the_models_own(folders, cli, photo):
    """Covers run through image_logits: on these models the family's forward, equal to the model's own logits."""
    model = load(folders["ViTForImageClassification"])
    inputs = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.image_logits(inputs), model.net(inputs), atol=0, rtol=0)
    result = cli("occlude-patches", photo, "--model", f"hf:{folders['ViTForImageClassification']}")
    assert result.exit_code == 0, result.stderr


def test_two_folders_of_one_name_write_to_two_model_folders(tmp_path):
    from vitcli.naming import model_folder

    first, second = tmp_path / "a" / "model", tmp_path / "b" / "model"
    names = {model_folder(f"hf:{folder}", False, 0, None, None) for folder in (first, second)}
    assert len(names) == 2 and all(name.startswith("hf_model-") for name in names)
    assert model_folder(f"hf:{first}", True, 3, None, None).endswith("-random-s3")


def test_another_module_layout_is_refused_in_one_line(cli, folders, monkeypatch, no_loading):
    """transformers 4 named the blocks `encoder.layer` and the projections `query`, `key`, `value`: a layout vitcli
    does not know is refused before loading, naming what is missing."""
    from vitcli.capture.families import hf

    moved = dataclasses.replace(hf.LAYOUTS["ViTModel"], layers="encoder.layer")
    monkeypatch.setitem(hf.LAYOUTS, "ViTModel", moved)
    line = refused(cli, "--model", f"hf:{folders['ViTModel']}/.")  # another spelling: no skeleton cached by name
    assert "has no encoder.layer" in line and "module layout of transformers 5" in line


def test_a_config_that_is_not_json_is_refused(cli, tmp_path, no_loading):
    (tmp_path / "config.json").write_text("{")
    line = refused(cli, "--model", f"hf:{tmp_path}")
    assert "its config.json cannot be read" in line


@pytest.mark.parametrize("name", MODELS)
def test_timms_readout_path_embed_and_positions_are_the_models_own(folders, name):
    """What the timm-written readers call (forward_features, forward_head, norm, head, pos_embed) and the family's
    embed give the model's own numbers: the output, the pooled embedding, block 1's input, and on ViT and DINOv2 the
    patch projection plus its position embedding as the row entering block 1 (CLIP normalizes that sum first)."""
    model = load(folders[name])
    net, family = model.net, family_of(model.net)
    inputs = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        with caching(net, ["blocks.1.hook_resid_pre"]) as cache:
            output = net(inputs)
        torch.testing.assert_close(net.forward_head(net.forward_features(inputs)), output)
        torch.testing.assert_close(
            net.forward_head(net.forward_features(inputs), pre_logits=True), family.pooled(inputs)
        )
        rows = family.embed(inputs)
        torch.testing.assert_close(rows, cache["blocks.1.hook_resid_pre"])
        weight, bias = model.patch_projection
        projection = model.flatten_patches(inputs) @ weight + bias
        positions = net.pos_embed
    prefix = len(PREFIX.get(name, ("CLS",)))
    assert positions.shape == (1, 17, 64)
    if name != "CLIPVisionModel":
        torch.testing.assert_close(projection + positions[:, 1:], rows[:, prefix:], atol=1e-5, rtol=1e-5)


def test_attribute_by_head_follows_dinov2s_layer_scale(cli, tmp_path, photo):
    """Seen to fail (self-check: the terms did not rebuild the score) before the per-head readout took Dinov2's
    layer_scale1 into account: with layerscale_value 0.3 each head's term was 1/0.3 too large."""
    folder = tmp_path / "dinov2"
    torch.manual_seed(0)
    transformers.Dinov2Model(transformers.Dinov2Config(layerscale_value=0.3, **TINY)).save_pretrained(folder)
    result = cli("attribute", photo, "--by", "head", "--model", f"hf:{folder}", "--target-feature", "0")
    assert result.exit_code == 0, result.stderr  # exit 1 when the terms do not rebuild the score
