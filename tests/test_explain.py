"""explain: relevance, grad-rollout, Grad-CAM, attention, rollout and occlusion maps, checked against oracles written
here from the papers' equations, finite differences, pytorch-grad-cam, and the model's own forward."""

from __future__ import annotations

import csv
import io
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vitcli.errors import UsageError
from vitcli.experiments.explain import (
    capture_gradients,
    check_methods,
    explain,
    resolve_block,
    unfused_attention,
)
from vitcli.experiments.faithfulness import RANDOM
from vitcli.explain_methods import METHOD_NAMES as METHODS
from vitcli.model import VitModel
from vitcli.presentation import explain as presentation

from conftest import RANDOM_CPU, result_files, small_vit

# float32 maps computed along different operation orders (timm scales q before q k^T, the oracle after) agree to
# about 1e-6 of their largest value; 1e-5 leaves room and still catches any change of the rule.
RELATIVE_TOLERANCE = 1e-5


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def registers():
    """DINOv2 ViT-S/14 with 4 register tokens (CLS + R1..R4 before the patches), 2 blocks, 56x56: 4x4 patches."""
    return small_vit("vit_small_patch14_reg4_dinov2", depth=2, img_size=56, num_classes=10)


def relative_error(ours: np.ndarray, reference: np.ndarray) -> float:
    return float(np.abs(ours - reference).max() / np.abs(reference).max())


# ----- an oracle written from the equations: forward by hand, attention kept as graph nodes


def hand_forward(net, image: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """logits, each block's attention softmax(q k^T / sqrt(d)) and each block's norm1 output, computed by hand
    from the modules' weights (the embedding and the final head are the model's own modules)."""
    hidden = net.norm_pre(net._pos_embed(net.patch_embed(image)))
    attentions, normed_rows = [], []
    for block in net.blocks:
        attention = block.attn
        normed = block.norm1(hidden)
        normed_rows.append(normed)
        batch, tokens, width = normed.shape
        heads, head_dim = attention.num_heads, width // attention.num_heads
        qkv = F.linear(normed, attention.qkv.weight, attention.qkv.bias)
        q, k, v = qkv.reshape(batch, tokens, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(head_dim), dim=-1)
        attentions.append(weights)
        mixed = (weights @ v).transpose(1, 2).reshape(batch, tokens, width)
        hidden = hidden + block.ls1(attention.proj(mixed))
        hidden = hidden + block.ls2(block.mlp(block.norm2(hidden)))
    return net.forward_head(net.norm(hidden)), attentions, normed_rows


def chefer_relevance(net, image: torch.Tensor, target: int, prefix: int, rows: int, cols: int) -> np.ndarray:
    """Chefer, Gur and Wolf, ICCV 2021, eq. 5-6: A-bar = E_h[(grad A * A)^+]; R = I; R = R + A-bar R; CLS row."""
    logits, attentions, _ = hand_forward(net, image)
    gradients = torch.autograd.grad(logits[0, target], attentions)
    relevance = torch.eye(attentions[0].shape[-1], dtype=torch.float64)
    for weights, gradient in zip(attentions, gradients, strict=True):
        a_bar = (gradient[0] * weights[0]).double().clamp(min=0).mean(dim=0)
        relevance = relevance + a_bar @ relevance
    return relevance[0, prefix:].reshape(rows, cols).detach().numpy()


def hand_rollout(attentions: list[torch.Tensor], prefix: int, rows: int, cols: int) -> np.ndarray:
    """Abnar and Zuidema: mean over heads, plus identity, rows renormalized, multiplied from block 1 on."""
    result = torch.eye(attentions[0].shape[-1], dtype=torch.float64)
    for weights in attentions:
        step = weights[0].double().mean(dim=0) + torch.eye(weights.shape[-1], dtype=torch.float64)
        result = (step / step.sum(dim=-1, keepdim=True)) @ result
    return result[0, prefix:].reshape(rows, cols).detach().numpy()


@pytest.mark.parametrize("which", ["vit", "registers"])
def test_relevance_equals_the_papers_equations(request, photo, which):
    model = request.getfixturevalue(which)
    prepared = model.prepare(photo)
    grid = model.grid
    result = explain(model, prepared, ["relevance"])
    image = prepared.input[None].clone().requires_grad_(True)
    hand_logits = hand_forward(model.net, image)[0]
    assert torch.allclose(hand_logits, model.logits(prepared.input[None]), atol=1e-4)  # the oracle is the model
    reference = chefer_relevance(model.net, image, result.target.index, grid.num_prefix, grid.rows, grid.cols)
    ours = result.maps[0].values
    assert ours.shape == (grid.rows, grid.cols)
    assert relative_error(ours, reference) < RELATIVE_TOLERANCE


def test_grad_rollout_attention_and_rollout_equal_hand_computations(vit, photo):
    prepared = vit.prepare(photo)
    grid = vit.grid
    result = explain(vit, prepared, ["grad-rollout", "attention", "rollout"], block=5)
    maps = {item.method: item.values for item in result.maps}
    image = prepared.input[None].clone().requires_grad_(True)
    logits, attentions, _ = hand_forward(vit.net, image)
    gradients = torch.autograd.grad(logits[0, result.target.index], attentions)
    weighted = [
        (gradient * weights).mean(dim=1, keepdim=True).clamp(min=0)
        for weights, gradient in zip(attentions, gradients, strict=True)
    ]
    assert relative_error(maps["grad-rollout"], hand_rollout(weighted, 1, grid.rows, grid.cols)) < RELATIVE_TOLERANCE
    assert relative_error(maps["rollout"], hand_rollout(attentions, 1, grid.rows, grid.cols)) < RELATIVE_TOLERANCE
    # Block 5's own CLS row, heads averaged, the patch sources only: never renormalized, so it sums below 1.
    cls_row = attentions[4][0].mean(dim=0)[0, 1:].detach().double().numpy().reshape(grid.rows, grid.cols)
    assert relative_error(maps["attention"], cls_row) < RELATIVE_TOLERANCE
    assert maps["attention"].sum() < 1


# ----- finite differences on a small input


@pytest.fixture(scope="module")
def tiny2_double():
    model = small_vit("vit_tiny_patch16_224.augreg_in21k_ft_in1k", depth=2, img_size=32)
    model.net.double()
    return model


def perturbed_logit(net, module, index: tuple[int, ...], delta: float, image: torch.Tensor, target: int) -> float:
    """The target logit with one entry of a module's output moved by delta (a forward hook adds it)."""

    def shift(_module, _inputs, output):
        moved = output.clone()
        moved[index] += delta
        return moved

    handle = module.register_forward_hook(shift)
    try:
        with torch.no_grad(), unfused_attention(net):
            return float(net(image)[0, target])
    finally:
        handle.remove()


def test_captured_gradients_equal_finite_differences(tiny2_double, photo):
    """Central differences in float64 at the largest-gradient entries and a few others, per block."""
    model = tiny2_double
    net = model.net
    image = model.prepare(photo).input
    target = 3
    capture = capture_gradients(model, image, target, attention=True, feature_block=2)
    generator = torch.Generator().manual_seed(0)
    step = 1e-6
    checked = 0
    for block in range(model.depth):
        gradients = capture.attention_gradients[block]
        largest = gradients.abs().reshape(-1).topk(3).indices
        chosen = torch.cat([largest, torch.randint(0, gradients.numel(), (2,), generator=generator)])
        for flat in chosen.tolist():
            where = np.unravel_index(flat, gradients.shape)
            module = net.blocks[block].attn.attn_drop
            index = (0, *where)
            difference = (
                perturbed_logit(net, module, index, step, image[None].double(), target)
                - perturbed_logit(net, module, index, -step, image[None].double(), target)
            ) / (2 * step)
            assert difference == pytest.approx(float(gradients[where]), rel=1e-5, abs=1e-8)
            checked += 1
    features = capture.feature_gradients
    for flat in features.abs().reshape(-1).topk(3).indices.tolist():
        where = np.unravel_index(flat, features.shape)
        module = net.blocks[1].norm1
        difference = (
            perturbed_logit(net, module, (0, *where), step, image[None].double(), target)
            - perturbed_logit(net, module, (0, *where), -step, image[None].double(), target)
        ) / (2 * step)
        assert difference == pytest.approx(float(features[where]), rel=1e-5, abs=1e-8)
        checked += 1
    assert checked == 2 * 5 + 3
    assert capture.output_difference < 1e-12  # float64 throughout


# ----- Grad-CAM against pytorch-grad-cam


def grad_cam_reference(model: VitModel, image: torch.Tensor, target: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """pytorch-grad-cam's GradCAM with its documented ViT reshape_transform (prefix tokens dropped); returns the raw
    map (before its min-max scaling) and the package's own scaled, resized output."""
    grad_cam = pytest.importorskip("pytorch_grad_cam")
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    grid = model.grid

    def reshape_transform(tensor, height=grid.rows, width=grid.cols):
        result = tensor[:, grid.num_prefix :, :].reshape(tensor.size(0), height, width, tensor.size(2))
        return result.transpose(2, 3).transpose(1, 2)

    layer = model.net.blocks[block - 1].norm1
    targets = [ClassifierOutputTarget(target)]
    try:
        with grad_cam.GradCAM(model=model.net, target_layers=[layer], reshape_transform=reshape_transform) as cam:
            scaled = cam(input_tensor=image[None], targets=targets)
            stored = cam.activations_and_grads
            activations, gradients = stored.activations[0].numpy(), stored.gradients[0].numpy()
            raw = cam.get_cam_image(image[None], layer, targets, activations, gradients)
    finally:
        model.net.zero_grad(set_to_none=True)  # its backward fills the parameters' .grad
    return np.maximum(raw, 0)[0], scaled[0]


@pytest.mark.parametrize(("which", "block"), [("vit", None), ("vit", 6), ("registers", None)])
def test_gradcam_equals_pytorch_grad_cam(request, photo, which, block):
    from pytorch_grad_cam.utils.image import scale_cam_image

    model = request.getfixturevalue(which)
    prepared = model.prepare(photo)
    result = explain(model, prepared, ["gradcam"], block=block)
    assert result.block == (block or model.depth)
    raw, scaled = grad_cam_reference(model, prepared.input, result.target.index, result.block)
    ours = result.maps[0].values
    assert ours.shape == (model.grid.rows, model.grid.cols) == raw.shape
    assert ours.max() > 0
    assert np.abs(ours - raw).max() <= 1e-5 * np.abs(raw).max()
    # The package's own output: min-max scaled and resized per layer, then scaled again when layers are combined.
    height, width = prepared.input.shape[1:]
    assert np.abs(scale_cam_image(scale_cam_image(ours[None], (width, height)))[0] - scaled).max() <= 1e-5


# ----- the hooked pass leaves the model as it was


def test_hooks_leave_the_model_unchanged(tiny2, photo):
    prepared = tiny2.prepare(photo)
    before = tiny2.logits(prepared.input[None])
    result = explain(tiny2, prepared, ["relevance", "gradcam"])
    assert result.output_difference is not None and result.output_difference <= 1e-5
    assert all(block.attn.fused_attn for block in tiny2.net.blocks)
    assert all(parameter.grad is None for parameter in tiny2.net.parameters())
    assert all(not module._forward_hooks for module in tiny2.net.modules())
    assert torch.equal(tiny2.logits(prepared.input[None]), before)


def test_unfused_attention_is_restored_after_an_error(tiny2):
    with pytest.raises(RuntimeError), unfused_attention(tiny2.net):
        assert not any(block.attn.fused_attn for block in tiny2.net.blocks)
        raise RuntimeError("inside")
    assert all(block.attn.fused_attn for block in tiny2.net.blocks)


def test_target_changes_the_gradient_maps(tiny2, photo):
    prepared = tiny2.prepare(photo)
    first = explain(tiny2, prepared, ["relevance", "gradcam"], target="1")
    second = explain(tiny2, prepared, ["relevance", "gradcam"], target="2")
    assert first.target.index == 1 and second.target.index == 2
    for one, two in zip(first.maps, second.maps, strict=True):
        assert not np.allclose(one.values, two.values)


# ----- occlusion through explain


def test_occlusion_map_equals_hand_covered_copies(tiny2, photo):
    prepared = tiny2.prepare(photo)
    result = explain(tiny2, prepared, ["occlusion"], fill="black")
    grid = tiny2.grid
    black = (torch.zeros(3, 1, 1) - torch.tensor(tiny2.mean).reshape(3, 1, 1)) / torch.tensor(tiny2.std).reshape(
        3, 1, 1
    )
    with torch.inference_mode():
        clean = float(tiny2.net(prepared.input[None]).softmax(-1)[0, result.target.index])
    for patch in (1, 6, grid.num_patches):
        left, top, right, bottom = grid.pixel_box(patch)
        covered = prepared.input.clone()
        covered[:, top:bottom, left:right] = black
        with torch.inference_mode():
            probability = float(tiny2.net(covered[None]).softmax(-1)[0, result.target.index])
        row, col = grid.position(patch)
        assert result.maps[0].values[row, col] == pytest.approx(100 * (clean - probability), abs=1e-4)


# ----- options


def test_options_are_checked(tiny2, photo):
    assert check_methods(["gradcam", "relevance", "gradcam"]) == ["gradcam", "relevance"]
    with pytest.raises(UsageError, match="unknown --method"):
        check_methods(["lrp"])
    with pytest.raises(UsageError, match="--block must be between 1 and 2"):
        resolve_block(tiny2, 3)
    with pytest.raises(UsageError, match="--target"):
        explain(tiny2, tiny2.prepare(photo), ["gradcam"], target="99999")


# ----- presentation


def test_presentation_keeps_raw_values_and_names_patches(tiny2, photo):
    result = explain(tiny2, tiny2.prepare(photo), list(METHODS))
    grid = tiny2.grid
    rows = presentation.rows(result)
    assert len(rows) == len(METHODS) * grid.num_patches
    by_method = {item.method: item.values for item in result.maps}
    for row in rows[:: grid.num_patches + 1]:
        number = int(row["patch"][1:])
        assert row["value"] == by_method[row["method"]][grid.position(number)]
        assert row["token"] == number  # one prefix token: patch number = token index
    document = json.loads(json.dumps(presentation.document(result)))
    for entry in document["maps"]:
        assert np.array_equal(np.array(entry["values"]), by_method[entry["method"]])  # raw, not normalized
        best = entry["top"][0]
        assert float(by_method[entry["method"]].max()) == best["value"]
    summary = presentation.summary(result)
    assert summary["explain_target_class"] == result.target.index
    assert set(summary) >= {f"explain_{method.replace('-', '_')}_top_patch" for method in METHODS}
    figure = presentation.figure(result)
    captions = [panel.get_xlabel() for panel in figure.axes if panel.get_title() in METHODS]
    assert len(captions) == len(METHODS) and all("own colour scale" in caption for caption in captions)
    assert "RANDOM (seed 0)" in figure._suptitle.get_text()


# ----- the command


def test_explain_command_writes_raw_maps_and_curves(cli, workdir, vit, photo):
    result = cli(
        "explain",
        photo,
        *RANDOM_CPU,
        "-M",
        "relevance",
        "-M",
        "gradcam",
        "--faithfulness",
        "--steps",
        "2",
        "--random-orders",
        "1",
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.stderr
    (document,) = json.loads(result.stdout)["results"]
    name = "explain-mrelevance_gradcam-b12-gray-ttop1-f2-r1-o0"
    assert document["experiment"]["name"] == name
    files = result_files(workdir / "outputs", name)
    assert set(files) == {"json", "csv", "png", "curves.csv", "relevance.npy", "gradcam.npy"}
    assert json.loads(files["json"].read_text())["result"] == document["result"]
    # The same numbers as the experiment called directly on the same model: raw, not normalized.
    direct = explain(vit, vit.prepare(photo), ["relevance", "gradcam"])
    for entry, item in zip(document["result"]["maps"], direct.maps, strict=True):
        assert entry["method"] == item.method
        assert np.allclose(np.array(entry["values"]), item.values, rtol=1e-6, atol=0)
    curves = list(csv.DictReader(io.StringIO(files["curves.csv"].read_text())))
    assert len(curves) == 3 * 2 * 3  # (2 maps + random) x (deletion, insertion) x (steps + 1)
    assert {(row["image"], row["weights"], row["result"]) for row in curves} == {(str(photo), "RANDOM (seed 0)", name)}
    rows = list(csv.DictReader(io.StringIO(files["csv"].read_text())))
    assert len(rows) == 2 * vit.grid.num_patches and rows[0]["weights"] == "RANDOM (seed 0)"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--block", "13"], "--block must be between 1 and 12"),
        (["--steps", "5"], "add --faithfulness"),
        (["--faithfulness", "--steps", "197"], "--steps must be between 1 and 196"),
        (["--target", "no such class at all"], "--target"),
        (["--method", "lrp"], "lrp"),
    ],
)
def test_explain_command_refuses_bad_options(cli, photo, arguments, message):
    result = cli("explain", photo, *RANDOM_CPU, *arguments)
    assert result.exit_code == 2
    assert message in result.stderr


def test_faithfulness_over_several_images_gives_each_methods_mean_and_spread(cli, photo, newfoundland, workdir):
    arguments = ["--method", "rollout", "--faithfulness", "--steps", "2", "--random-orders", "2", "-q"]
    result = cli("explain", photo, newfoundland, *RANDOM_CPU, *arguments)
    assert result.exit_code == 0, result.stderr
    per_image = [json.loads(path.read_text()) for path in sorted((workdir / "outputs").glob("*/*-*/explain-*.json"))]
    per_image = [document for document in per_image if "images" not in document["experiment"]["settings"]]
    assert len(per_image) == 2
    (across,) = (workdir / "outputs").glob("*/set-*/explain-*-across-images.json")
    rows = {row["method"]: row for row in json.loads(across.read_text())["result"]["methods"]}
    for method, key in (("rollout", "rollout"), (RANDOM, "random")):
        deletion = [_auc(document, key, "deletion") for document in per_image]
        assert rows[method]["images"] == 2
        assert rows[method]["deletion_auc_mean"] == pytest.approx(sum(deletion) / 2, abs=1e-12)
        assert rows[method]["deletion_auc_sd"] == pytest.approx(abs(deletion[0] - deletion[1]) / 2**0.5, abs=1e-12)


def _auc(document: dict, method: str, curve: str) -> float:
    """An AUC read back from one image's own JSON, independently of the spread code."""
    faithfulness = document["result"]["faithfulness"]
    if method == "random":
        return faithfulness["random"][curve]["auc"]
    (entry,) = [item for item in faithfulness["methods"] if item["method"] == method]
    return entry[curve]["auc"]
