"""Oracle tests of the shared model wrapper: our explicit computations against timm's own modules."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pytest
import timm
import torch
from PIL import Image

from vitcli.errors import UsageError, VitcliError
from vitcli.experiments.predict import predict
from vitcli.loading import load_model
from vitcli.model import VitModel, state_dict_sha256
from vitcli.spec import WeightsSpec
from vitcli.weights import load_checkpoint

# float32 arithmetic through 12 blocks in a different order (explicit vs fused): differences stay far below this.
FORWARD_TOLERANCE = 1e-4
PROJECTION_TOLERANCE = 1e-5


def small_vit(**kwargs) -> VitModel:
    """A real timm ViT-Tiny variant (2 blocks) with seeded random weights, wrapped as the CLI would wrap it."""
    torch.manual_seed(1)
    net = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=2, **kwargs)
    return VitModel(net, WeightsSpec(model_name="vit_tiny_patch16_224", random=True, seed=1), torch.device("cpu"), 8)


def random_inputs(model: VitModel, batch: int = 2) -> torch.Tensor:
    torch.manual_seed(7)
    height, width = model.data_config["input_size"][1:]
    return torch.randn(batch, 3, height, width)


def own_block_outputs(
    model: VitModel, inputs: torch.Tensor
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """Block and attention-module outputs of the model's own (fused) forward, captured by hooks."""
    blocks, attentions = [], []
    handles = []
    for block in model.net.blocks:
        handles.append(block.register_forward_hook(lambda _m, _i, out: blocks.append(out.detach().clone())))
        handles.append(block.attn.register_forward_hook(lambda _m, _i, out: attentions.append(out.detach().clone())))
    try:
        with torch.inference_mode():
            logits = model.net(inputs)
    finally:
        for handle in handles:
            handle.remove()
    return blocks, attentions, logits


@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"patch_size": 32},
        {"patch_size": 8, "img_size": 64},
        {"img_size": 384},
        {"reg_tokens": 4},
        {"no_embed_class": True},
        {"qk_norm": True, "init_values": 1e-3},
    ],
    ids=["tiny", "patch32", "patch8", "384", "registers", "no_embed_class", "qknorm_layerscale"],
)
def test_explicit_forward_reproduces_the_fused_model(variant):
    model = small_vit(**variant)
    assert all(block.attn.fused_attn for block in model.net.blocks), "the comparison must be against fused attention"
    inputs = random_inputs(model)
    trace = model.trace(inputs, keep=range(model.depth), logits=True)
    blocks, attentions, logits = own_block_outputs(model, inputs)
    assert (trace.logits - logits).abs().max() < FORWARD_TOLERANCE
    assert sorted(trace.blocks) == list(range(model.depth))
    for index, block in trace.blocks.items():
        assert (block.output - blocks[index]).abs().max() < FORWARD_TOLERANCE
        assert (block.attention_output - attentions[index]).abs().max() < FORWARD_TOLERANCE
        assert model.attention_self_check(block).max() < FORWARD_TOLERANCE
        sums = block.attention.sum(dim=-1)
        assert torch.allclose(sums, torch.ones_like(sums), atol=1e-5)
        assert block.attention.shape[-1] == model.grid.num_tokens


def test_default_architecture_explicit_forward(vit):
    inputs = random_inputs(vit, batch=1)
    trace = vit.trace(inputs, keep=range(12), logits=True)
    blocks, attentions, logits = own_block_outputs(vit, inputs)
    assert len(trace.blocks) == 12
    assert (trace.logits - logits).abs().max() < FORWARD_TOLERANCE
    assert max((trace.blocks[i].output - blocks[i]).abs().max() for i in range(12)) < FORWARD_TOLERANCE
    # The attention is softmax(q k^T / 8): recompute one head from the traced q and k by hand.
    block = trace.blocks[3]
    scores = block.q[0, 0].double() @ block.k[0, 0].double().T / 8.0
    assert torch.allclose(block.attention[0, 0].double(), scores.softmax(-1), atol=1e-6)


def test_trace_keeps_the_asked_blocks_and_stops_after_the_last(vit):
    """Forward hooks on each block's norm1 record which blocks the explicit forward ran."""
    ran = []
    handles = [
        block.norm1.register_forward_hook(lambda _module, _args, _output, index=index: ran.append(index))
        for index, block in enumerate(vit.net.blocks)
    ]
    inputs = random_inputs(vit, batch=1)
    try:
        partial = vit.trace(inputs, keep=[4, 1])
        assert ran == [0, 1, 2, 3, 4] and sorted(partial.blocks) == [1, 4] and partial.logits is None
        ran.clear()
        assert vit.trace(inputs).blocks == {} and ran == []
        ran.clear()
        whole = vit.trace(inputs, keep=[4], logits=True)
        assert ran == list(range(12)) and sorted(whole.blocks) == [4] and whole.logits.shape == (1, 1000)
    finally:
        for handle in handles:
            handle.remove()
    assert torch.equal(partial.blocks[4].attention, whole.blocks[4].attention)
    with pytest.raises(ValueError, match="below 12"):
        vit.trace(inputs, keep=[12])


def test_self_check_is_per_image_in_one_module_call_per_batch(vit):
    inputs = random_inputs(vit, batch=3)
    traced = vit.trace(inputs, keep=[2]).blocks[2]
    # Spoil image 1's explicit output: only its entry may show it.
    spoiled = traced.attention_output.clone()
    spoiled[1, 5, 7] += 0.5
    block = dataclasses.replace(traced, attention_output=spoiled)
    calls = []
    handle = vit.net.blocks[2].attn.register_forward_hook(lambda _m, args, _out: calls.append(args[0].shape[0]))
    try:
        differences = vit.attention_self_check(block)
    finally:
        handle.remove()
    assert calls == [3]
    assert differences.shape == (3,)
    assert differences[1] == pytest.approx(0.5, abs=FORWARD_TOLERANCE)
    assert differences[0] < FORWARD_TOLERANCE and differences[2] < FORWARD_TOLERANCE


def test_standard_blocks_are_checked_once_per_model(monkeypatch):
    import vitcli.model

    calls = []
    real = vitcli.model._attention_refusal
    monkeypatch.setattr(vitcli.model, "_attention_refusal", lambda *args: calls.append(args) or real(*args))
    model = small_vit()
    for _ in range(3):
        model.trace(random_inputs(model, batch=1), keep=[0, 1])
    assert len(calls) == 1


def test_channel_major_flattening_times_w_e_equals_the_conv2d(vit):
    inputs = random_inputs(vit)
    pixels = vit.flatten_patches(inputs)
    assert pixels.shape == (2, 196, 768)
    # Patch P63 (row 4, col 6): its first 256 values are the R plane read row by row, then G, then B.
    by_hand = inputs[1, :, 64:80, 96:112].reshape(-1)
    assert torch.equal(pixels[1, 62], by_hand)
    weight, bias = vit.patch_projection
    with torch.inference_mode():
        conv = vit.net.patch_embed.proj(inputs).flatten(2).transpose(1, 2)
    assert (pixels @ weight + bias - conv).abs().max() < PROJECTION_TOLERANCE


def test_preprocessing_is_timms_eval_transform(vit, newfoundland):
    prepared = vit.prepare(newfoundland)
    config = timm.data.resolve_data_config(model=vit.net)
    transform = timm.data.create_transform(**config, is_training=False)
    expected = transform(Image.open(newfoundland).convert("RGB"))
    assert torch.equal(prepared.input, expected)
    assert prepared.input.shape == (3, 224, 224)
    assert config["crop_pct"] == 0.9 and tuple(config["mean"]) == (0.5, 0.5, 0.5)
    # The kept crop is what the model saw: normalizing it gives the input back.
    assert torch.allclose((prepared.crop - 0.5) / 0.5, prepared.input, atol=1e-6)


def test_top_k_probabilities_are_the_softmax_of_the_model_logits(vit, photo):
    prepared = vit.prepare(photo)
    prediction = predict(vit.logits(prepared.input[None])[0], vit.labels, prepared.source, vit.spec.label, 5)
    with torch.inference_mode():
        probabilities = vit.net(prepared.input.unsqueeze(0)).softmax(-1)[0]
    values, indices = probabilities.topk(5)
    assert [score.index for score in prediction.top] == indices.tolist()
    assert np.allclose([score.probability for score in prediction.top], values.tolist(), atol=1e-6)
    assert [score.label for score in prediction.top] == [
        timm.data.ImageNetInfo().index_to_description(i) for i in indices
    ]


def test_batching_does_not_change_logits(vit, photo, newfoundland):
    inputs = torch.stack([vit.prepare(path).input for path in (photo, newfoundland, photo)])
    small = load_model(WeightsSpec(random=True, seed=0), "cpu", 2)
    assert small.net is not vit.net and small.batch_size == 2
    one_at_a_time = torch.cat([vit.logits(image[None]) for image in inputs])
    assert (vit.logits(inputs) - one_at_a_time).abs().max() < FORWARD_TOLERANCE
    assert (small.logits(inputs) - one_at_a_time).abs().max() < FORWARD_TOLERANCE


def test_model_is_loaded_once_per_process(vit):
    assert load_model(WeightsSpec(random=True, seed=0), "cpu") is vit
    assert vit.batch_size == 8, "a CPU run without --batch-size uses the CPU default"


def test_parameter_hash_follows_its_definition(vit):
    digest = hashlib.sha256()
    for name, tensor in sorted(vit.net.state_dict().items()):
        digest.update(name.encode("utf-8") + tensor.numpy().tobytes())
    assert vit.parameter_sha256 == digest.hexdigest()
    assert state_dict_sha256({"b": torch.ones(2), "a": torch.zeros(1)}) != state_dict_sha256(
        {"a": torch.ones(2), "b": torch.zeros(1)}
    )


def test_prefix_tokens_are_named_and_patches_numbered_after_them():
    registers = small_vit(reg_tokens=4)
    assert registers.grid.prefix_names == ("CLS", "R1", "R2", "R3", "R4")
    assert registers.grid.token_of_patch(1) == 5
    torch.manual_seed(0)
    distilled = VitModel(
        timm.create_model("deit_tiny_distilled_patch16_224", depth=2), WeightsSpec(random=True), torch.device("cpu"), 8
    )
    assert distilled.grid.prefix_names == ("CLS", "DIST")
    inputs = random_inputs(distilled, batch=1)
    with torch.inference_mode():
        own = distilled.net(inputs)
    assert (distilled.trace(inputs, logits=True).logits - own).abs().max() < FORWARD_TOLERANCE


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("resnet18", "not a Vision Transformer"),
        ("vit_tiny_r_s16_p8_224", "embeds patches with HybridEmbed"),
        ("vit_tiny_patch16_244", "did you mean vit_tiny_patch16_224"),
    ],
)
def test_unsupported_models_are_refused_clearly(name, message):
    with pytest.raises(UsageError, match=message):
        load_model(WeightsSpec(model_name=name, random=True), "cpu", 1)


def test_non_standard_blocks_are_refused_for_attention_capture():
    model = load_model(WeightsSpec(model_name="vit_small_patch16_18x2_224", random=True), "cpu", 1)
    with pytest.raises(VitcliError, match="cannot capture attention .* ParallelThingsBlock"):
        model.trace(torch.zeros(1, 3, 224, 224), keep=[0])
    # The embedding alone runs no block: `patches` works on any ViT.
    assert model.trace(torch.zeros(1, 3, 224, 224)).tokens.shape == (1, 197, 384)


def test_checkpoints_load_strictly(tmp_path, vit):
    from safetensors.torch import save_file

    state = {name: tensor.clone() for name, tensor in vit.net.state_dict().items()}
    save_file(state, tmp_path / "weights.safetensors")
    torch.save({"state_dict": state}, tmp_path / "wrapped.pth")
    for path in (tmp_path / "weights.safetensors", tmp_path / "wrapped.pth"):
        net = timm.create_model("vit_tiny_patch16_224", pretrained=False)
        load_checkpoint(net, path, "vit_tiny_patch16_224")
        assert state_dict_sha256(net.state_dict()) == vit.parameter_sha256

    state["head.weight"] = torch.zeros(10, 192)
    save_file(state, tmp_path / "ten_classes.safetensors")
    net = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    with pytest.raises(
        VitcliError,
        match=r"does not match .*1 shape mismatches \(e.g. head.weight: checkpoint \[10, 192\], model \[1000, 192\]\)",
    ):
        load_checkpoint(net, tmp_path / "ten_classes.safetensors", "vit_tiny_patch16_224")


def test_pickled_objects_are_never_unpickled(tmp_path):
    path = tmp_path / "evil.pth"
    torch.save({"model": {"head.weight": torch.zeros(1)}, "extra": np.dtype("float32")}, path)
    net = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    with pytest.raises(VitcliError, match="cannot read checkpoint"):
        load_checkpoint(net, path, "vit_tiny_patch16_224")
