"""The text tower of open_clip models (VitModel.text): open_clip's own encode_text, normalized; the tokenizer's limit;
CLIP's template recipe; the "text_tower" feature before any weights load."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812  (the usual name)

open_clip = pytest.importorskip("open_clip")

from tiny_open_clip import CONTEXT, TINY_CLIP, register  # noqa: E402

from vitcli.errors import UsageError  # noqa: E402
from vitcli.spec import WeightsSpec  # noqa: E402

TEXTS = ["a dog", "a photo of a cat.", "a red car on a road"]


@pytest.fixture(scope="module")
def clip_model():
    from vitcli.loading import load_model

    register()
    return load_model(WeightsSpec(model_name=f"open_clip:{TINY_CLIP}", random=True, seed=3), "cpu")


@pytest.fixture(scope="module")
def reference():
    register()
    torch.manual_seed(3)
    return open_clip.create_model(TINY_CLIP, pretrained=None).eval()


def test_encode_is_open_clips_encode_text_normalized(clip_model, reference):
    tokens = open_clip.get_tokenizer(TINY_CLIP)(TEXTS)
    with torch.no_grad():
        expected = F.normalize(reference.encode_text(tokens), dim=-1)
    encoded = clip_model.text.encode(TEXTS)
    assert encoded.dtype == torch.float32 and encoded.shape == expected.shape
    torch.testing.assert_close(encoded, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(encoded.norm(dim=-1), torch.ones(len(TEXTS)), atol=1e-6, rtol=0)


def test_the_text_space_is_the_image_embeddings(clip_model, reference):
    """Text and image embeddings have one width, and the tower's scale is open_clip's exp(logit_scale)."""
    inputs = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        pooled = clip_model.family.pooled(inputs)
    assert pooled.shape[-1] == clip_model.text.encode(["a dog"]).shape[-1]
    assert clip_model.text.scale == pytest.approx(float(reference.logit_scale.detach().exp()), rel=1e-6)
    assert clip_model.text.kind == "softmax" and clip_model.text.bias is None
    assert clip_model.text.context_length == CONTEXT


def test_templates_are_averaged_as_clips_recipe(clip_model):
    labels, templates = ["dog", "cat"], ["a photo of a {}.", "a drawing of a {}.", "{}"]
    direct = []
    for label in labels:
        each = clip_model.text.encode([template.format(label) for template in templates])
        mean = each.mean(dim=0)
        direct.append(mean / mean.norm())
    torch.testing.assert_close(clip_model.text.encode_labels(labels, templates), torch.stack(direct), atol=1e-6, rtol=0)


def test_a_text_longer_than_the_context_is_refused_naming_the_limit(clip_model):
    clip_model.text.check(["word " * (CONTEXT - 2)], "--labels")  # start + 14 words + end: fits exactly
    with pytest.raises(UsageError, match=f"reads at most {CONTEXT} .*start and end"):
        clip_model.text.check(["word " * (CONTEXT - 1)], "--labels")


def test_empty_texts_are_refused(clip_model):
    with pytest.raises(UsageError, match="--labels is empty"):
        clip_model.text.check([], "--labels")
    with pytest.raises(UsageError, match="a text is empty"):
        clip_model.text.check(["dog", " "], "--labels")


def test_only_open_clip_models_have_a_text_tower_before_loading(vit):
    from vitcli.loading import describe

    register()
    spec = WeightsSpec(model_name=f"open_clip:{TINY_CLIP}", random=True)
    assert "text_tower" in describe(spec).features
    assert "text_tower" not in describe(WeightsSpec(random=True)).features
    assert vit.text is None


def test_a_checkpoint_of_the_image_tower_alone_brings_no_text_tower(clip_model, tmp_path):
    from safetensors.torch import save_file

    from vitcli.loading import describe, load_model

    whole, visual = tmp_path / "whole.safetensors", tmp_path / "visual.safetensors"
    clip = clip_model.net.visual
    state = {f"visual.{key}": value.contiguous() for key, value in clip.state_dict().items()}
    save_file(state, visual)
    reference_state = dict(open_clip.create_model(TINY_CLIP, pretrained=None).state_dict())
    reference_state["logit_scale"] = torch.tensor(2.0)  # not the initial value: the text side's own weights load
    save_file({key: value.contiguous() for key, value in reference_state.items()}, whole)
    name = f"open_clip:{TINY_CLIP}"
    assert "text_tower" not in describe(WeightsSpec(model_name=name, checkpoint=visual)).features
    assert load_model(WeightsSpec(model_name=name, checkpoint=visual), "cpu").text is None
    assert "text_tower" in describe(WeightsSpec(model_name=name, checkpoint=whole)).features
    loaded = load_model(WeightsSpec(model_name=name, checkpoint=whole), "cpu")
    assert loaded.text.scale == pytest.approx(float(torch.tensor(2.0).exp()))
