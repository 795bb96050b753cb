"""open_clip models whose image tower is a TimmModel around a timm VisionTransformer (SigLIP's): the image tower is
the timm trunk (TimmViT, attention pooling 'map') with open_clip's preprocessing, paired with the text tower. A tiny
SigLIP-like config (tests/tiny_open_clip.py) stands in for ViT-B-16-SigLIP, whose skeleton alone is checked."""

from __future__ import annotations

import pytest
import torch

open_clip = pytest.importorskip("open_clip")

from tiny_open_clip import TINY_PROJECTED, TINY_SIGMOID, register  # noqa: E402

from vitcli.errors import UsageError, VitcliError  # noqa: E402
from vitcli.spec import WeightsSpec  # noqa: E402

NAME = f"open_clip:{TINY_SIGMOID}"


@pytest.fixture(scope="module")
def reference():
    register()
    torch.manual_seed(0)
    model, _train, preprocess = open_clip.create_model_and_transforms(TINY_SIGMOID, pretrained=None)
    return model.eval(), preprocess


@pytest.fixture(scope="module")
def siglip():
    from vitcli.loading import load_model

    register()
    return load_model(WeightsSpec(model_name=NAME, random=True, seed=0), "cpu")


def test_the_image_tower_is_the_timm_trunk_and_its_output_open_clips_encode_image(siglip, reference):
    from timm.models.vision_transformer import VisionTransformer

    model, _preprocess = reference
    assert isinstance(siglip.net, VisionTransformer) and siglip.family.name == "timm VisionTransformer"
    assert siglip.family.pooling == "map" and siglip.num_classes == 0
    inputs = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(siglip.family.pooled(inputs), model.encode_image(inputs), atol=1e-5, rtol=1e-5)


def test_the_preprocessing_is_open_clips_own(siglip, reference, persian):
    from PIL import Image

    _model, preprocess = reference
    expected = preprocess(Image.open(persian).convert("RGB"))
    torch.testing.assert_close(siglip.prepare(persian).input, expected, atol=1e-6, rtol=0)


def test_the_text_tower_is_sigmoid_with_a_bias(siglip, reference):
    model, _preprocess = reference
    assert siglip.text.kind == "sigmoid"
    assert siglip.text.bias == pytest.approx(float(model.logit_bias.detach()))
    assert siglip.text.scale == pytest.approx(float(model.logit_scale.detach().exp()))


def test_a_checkpoint_of_the_whole_model_or_of_the_image_tower_loads(reference, tmp_path):
    from safetensors.torch import save_file

    from vitcli.loading import load_model

    model, _preprocess = reference
    torch.manual_seed(7)
    other = open_clip.create_model(TINY_SIGMOID, pretrained=None).eval()  # other weights than seed 0's
    with torch.no_grad():
        other.logit_bias.fill_(-3.0)
    whole, visual = tmp_path / "whole.safetensors", tmp_path / "visual.safetensors"
    save_file({key: value.contiguous() for key, value in other.state_dict().items()}, whole)
    save_file({f"visual.{key}": value.contiguous() for key, value in other.visual.state_dict().items()}, visual)
    inputs = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        expected = other.encode_image(inputs)
    for checkpoint in (whole, visual):
        loaded = load_model(WeightsSpec(model_name=NAME, checkpoint=checkpoint), "cpu")
        with torch.no_grad():
            torch.testing.assert_close(loaded.family.pooled(inputs), expected, atol=1e-5, rtol=1e-5)
    assert load_model(WeightsSpec(model_name=NAME, checkpoint=whole), "cpu").text.bias == pytest.approx(-3.0)
    assert load_model(WeightsSpec(model_name=NAME, checkpoint=visual), "cpu").text is None


def test_a_timm_tower_whose_output_is_projected_again_is_refused_in_one_line():
    from vitcli.loading import describe

    register()
    with pytest.raises(UsageError) as refusal:
        describe(WeightsSpec(model_name=f"open_clip:{TINY_PROJECTED}", random=True))
    message = str(refusal.value)
    assert "\n" not in message
    assert message.startswith(f"open_clip:{TINY_PROJECTED}'s image tower projects the timm trunk's pooled output")
    assert "timm_proj 'none'" in message


def test_vit_b_16_siglip_is_described_as_a_timm_trunk_with_a_text_tower():
    from vitcli.loading import describe

    architecture = describe(WeightsSpec(model_name="open_clip:ViT-B-16-SigLIP", random=True))
    assert architecture.family == "timm VisionTransformer" and architecture.global_pool == "map"
    assert {"text_tower", "attention_pooling"} <= architecture.features
    assert architecture.grid.prefix_names == () and architecture.embedding_width == 768


def test_a_tokenizer_that_cannot_be_fetched_is_refused_in_one_line(siglip, monkeypatch):
    """SigLIP's tokenizer comes from the Hugging Face hub; offline and uncached, its first use fails in one line."""
    from vitcli.text_tower import open_clip_text_tower

    def unreachable(*_args, **_kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files\nmore")

    monkeypatch.setattr(open_clip, "get_tokenizer", unreachable)
    tower = open_clip_text_tower(open_clip.create_model(TINY_SIGMOID, pretrained=None), "ViT-B-16-SigLIP", "cpu")
    with pytest.raises(VitcliError) as refusal:
        tower.encode(["a dog"])
    message = str(refusal.value)
    assert "\n" not in message and message.startswith("cannot build the tokenizer of open_clip:ViT-B-16-SigLIP")
    assert "Hugging Face hub" in message
