"""compare-patch-size: the lecture's counts, closed-form compute against torch's own count, padding as timm pads,
the checkpoint resampled to other patch sizes, measurement, and errors.

Oracles: the lecture's numbers; the built timm modules (parameter counts); FlopCounterMode on a real CPU forward;
timm's own dynamic_img_pad model; FlexiViT's defining property of the pseudo-inverse kernel; hand-made tensors for
the memory tracker.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from fractions import Fraction

import pytest
import timm
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from vitcli.experiments.patch_size import ARCHITECTURE_ONLY
from vitcli.experiments.patch_size_adapt import ADAPTED_NOTE, adapt_and_predict, adapt_net
from vitcli.experiments.patch_size_measure import LiveTensorPeak
from vitcli.experiments.patch_size_variants import (
    Variant,
    build_variant,
    count_variant,
    pad_to_patches,
    plan_variants,
    read_dimensions,
)
from vitcli.spec import DEFAULT_MODEL

from conftest import result_files

RANDOM_CPU = ["--weights", "random", "--seed", "0", "--device", "cpu"]
NOTE = "architectural comparison: the checkpoint was trained at patch 16"
# Both counts are integers; they agree exactly for timm's standard ViT, this tolerance only absorbs float division.
MAC_TOLERANCE = 1e-9


@pytest.fixture(scope="module")
def tiny():
    return read_dimensions(DEFAULT_MODEL)


@pytest.fixture(scope="module")
def lecture(tiny):
    return {variant.patch_size: variant for variant in plan_variants(tiny, [32, 16, 8], 224, pad=False)}


def test_lecture_counts_for_vit_tiny_at_224(tiny, lecture):
    assert (tiny.native_patch, tiny.embed_dim, tiny.depth, tiny.num_heads) == (16, 192, 12, 3)
    assert [lecture[p].patch_tokens for p in (32, 16, 8)] == [49, 196, 784]
    assert [lecture[p].tokens for p in (32, 16, 8)] == [50, 197, 785]
    assert lecture[16].scores_per_head_block == 38_809
    assert lecture[8].scores_per_head_block == 616_225
    assert round(lecture[8].scores_per_head_block / lecture[16].scores_per_head_block, 2) == 15.88
    assert lecture[8].patch_scores_per_head_block / lecture[16].patch_scores_per_head_block == 16
    assert lecture[16].scores_whole_model == 38_809 * 3 * 12
    assert [lecture[p].values_per_patch for p in (32, 16, 8)] == [3072, 768, 192]


@pytest.mark.parametrize("patch", [8, 16, 32])
def test_parameter_counts_match_the_built_module(lecture, patch):
    net = build_variant(lecture[patch], "meta")
    assert lecture[patch].patch_embedding_parameters == sum(p.numel() for p in net.patch_embed.proj.parameters())
    assert lecture[patch].position_embedding_parameters == net.pos_embed.numel()


def test_closed_form_macs_match_flop_counter_on_a_real_cpu_forward(lecture):
    """FlopCounterMode counts FLOPs = 2 x MACs of matmul/addmm/bmm/convolution. On the CPU torch's fused attention
    kernel is not counted, so the model runs its explicit q k^T path; softmax, norms and GELU are in neither count.
    Patch 8 is left to the meta-device count (test_cli_json_and_files) to keep the test fast."""
    for patch in (16, 32):
        variant = lecture[patch]
        torch.manual_seed(0)
        net = build_variant(variant, "cpu")
        for block in net.blocks:
            block.attn.fused_attn = False
        with FlopCounterMode(display=False) as counter, torch.inference_mode():
            net(torch.zeros(1, 3, 224, 224))
        flops = {str(op): count for op, count in counter.get_flop_counts()["Global"].items()}
        closed = variant.macs()
        assert set(flops) == {"aten.convolution", "aten.addmm", "aten.bmm"}
        assert flops["aten.bmm"] == 2 * closed.attention
        assert math.isclose(counter.get_total_flops() / 2, closed.total, rel_tol=MAC_TOLERANCE)
        assert count_variant(variant) == (closed, sum(p.numel() for p in net.parameters()))


def counted_flops(patch: int) -> dict[str, int]:
    """FlopCounterMode's FLOPs per operator for one forward of timm's ViT-Tiny at this patch size (meta device)."""
    net = timm.create_model(DEFAULT_MODEL, pretrained=False, patch_size=patch, device="meta").eval()
    for block in net.blocks:
        block.attn.fused_attn = False
    with FlopCounterMode(display=False) as counter, torch.inference_mode():
        net(torch.zeros(1, 3, 224, 224, device="meta"))
    return {str(operator): count for operator, count in counter.get_flop_counts()["Global"].items()}


def test_attention_work_grows_with_the_square_of_the_rows(lecture):
    """Counted by torch, not by the closed form: patch 8 has 785 rows against 197, and its q k^T and attention @ v
    work (the batched matmuls) grows by (785/197)^2, about 15.9, while the patch embedding costs 3 * 224 * 224 * 192
    MACs at every patch size that divides the image. The closed form must agree with each count."""
    flops = {patch: counted_flops(patch) for patch in (8, 16, 32)}
    assert Fraction(flops[8]["aten.bmm"], flops[16]["aten.bmm"]) == Fraction(785, 197) ** 2
    for patch, variant in lecture.items():
        assert flops[patch]["aten.convolution"] == 2 * 3 * 224 * 224 * 192
        assert flops[patch]["aten.bmm"] == 2 * variant.macs().attention
        assert flops[patch]["aten.addmm"] + flops[patch]["aten.convolution"] == 2 * variant.macs().rest


def test_pad_matches_timms_dynamic_img_pad(tiny):
    [padded, _] = plan_variants(tiny, [12], 224, pad=True)
    assert (padded.padded_size, padded.grid_side, padded.padding) == (228, 19, 4)
    torch.manual_seed(1)
    ours = build_variant(padded, "cpu")
    timms = timm.create_model(
        DEFAULT_MODEL, pretrained=False, patch_size=12, img_size=228, dynamic_img_pad=True, dynamic_img_size=True
    ).eval()
    timms.load_state_dict(ours.state_dict())
    image = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        assert torch.allclose(ours(pad_to_patches(image, 12)), timms(image), atol=1e-5)
    assert count_variant(padded)[0] == padded.macs()


def resampled_by_hand(vit, patch: int) -> torch.nn.Module:
    """The checkpoint at another patch size, built without vitcli: a fresh timm model at that patch size loaded with
    the kernel resampled by timm's resample_patch_embed and the position table by resample_abs_pos_embed."""
    from timm.layers import resample_abs_pos_embed, resample_patch_embed

    side = 224 // patch
    state = {name: tensor.clone() for name, tensor in vit.net.state_dict().items()}
    state["patch_embed.proj.weight"] = resample_patch_embed(state["patch_embed.proj.weight"], [patch, patch])
    state["pos_embed"] = resample_abs_pos_embed(state["pos_embed"], new_size=[side, side], num_prefix_tokens=1)
    net = timm.create_model(DEFAULT_MODEL, pretrained=False, patch_size=patch)
    net.load_state_dict(state)
    return net.eval()


def test_adapted_predictions_match_a_model_resampled_by_hand(vit, newfoundland, lecture):
    before = vit.parameter_sha256
    prepared = vit.prepare(newfoundland)
    image = prepared.input[None]
    with torch.inference_mode():
        same = adapt_net(vit.net, lecture[16])(image)
        by_hand = resampled_by_hand(vit, 8)(image).softmax(dim=-1)[0]
    assert torch.equal(same, vit.logits(image))
    run = adapt_and_predict(vit, [lecture[8], lecture[16]], prepared)
    predictions = run.predictions
    assert run.native_logit_difference == 0
    native = vit.logits(image).softmax(dim=-1)[0]
    native_top1 = int(native.argmax())
    assert predictions[16].top1_index == run.native_top1_index == native_top1
    assert predictions[16].top1_probability == pytest.approx(float(native[native_top1]), abs=1e-6)
    # On this image patch 8 changes the top-1, so its probability and the native class's are told apart.
    assert predictions[8].top1_index == int(by_hand.argmax()) != native_top1
    assert predictions[8].top1_probability == pytest.approx(float(by_hand.max()), abs=1e-6)
    assert predictions[8].native_top1_probability == pytest.approx(float(by_hand[native_top1]), abs=1e-6)
    # The shared network is a deep copy away from every adaptation.
    assert vit.net.patch_embed.patch_size == (16, 16) and vit.parameter_sha256 == state_sha(vit.net) == before


def read_csv(path):
    with path.open(newline="") as stream:
        return list(csv.DictReader(stream))


def state_sha(net):
    from vitcli.model import state_dict_sha256

    return state_dict_sha256(net.state_dict())


def test_resampled_kernel_keeps_embeddings_of_upsampled_patches(vit, photo, tiny):
    """FlexiViT's pseudo-inverse: for p' >= p, <resize(x), w'> = <x, w> for every patch x, with the resize timm
    inverts (bicubic, antialiased, applied to each patch on its own)."""
    adapted = adapt_net(vit.net, Variant(tiny, 32, 448))
    image = vit.prepare(photo).input[None]
    patches = image.reshape(1, 3, 14, 16, 14, 16).permute(0, 2, 4, 1, 3, 5).reshape(196, 3, 16, 16)
    large = F.interpolate(patches, size=(32, 32), mode="bicubic", antialias=True)
    upsampled = large.reshape(1, 14, 14, 3, 32, 32).permute(0, 3, 1, 4, 2, 5).reshape(1, 3, 448, 448)
    with torch.inference_mode():
        original = vit.net.patch_embed(image)
        resampled = adapted.patch_embed(upsampled)
    assert torch.allclose(resampled, original, atol=1e-3)


def test_live_tensor_peak_counts_tensors_alive_together():
    x = torch.ones(1000)
    with LiveTensorPeak() as tracker:
        y = x + 1
        z = y * 2
        del y
        w = z * 3
    del z, w
    assert tracker.peak_bytes == 2 * x.nbytes


# ----- the command


def test_cli_table_needs_no_weights(cli, monkeypatch):
    import vitcli.loading

    def no_weights(*_arguments):
        raise AssertionError("the counts loaded a model")

    monkeypatch.setattr(vitcli.loading, "load_model", no_weights)
    result = cli("compare-patch-size")
    assert result.exit_code == 0, result.stderr
    assert NOTE in result.stdout
    for number in ("616,225", "38,809", "15.88", "16.00", "784", "196", "49"):
        assert number in result.stdout


def test_cli_json_and_files(cli, workdir):
    result = cli("compare-patch-size", "--patch-sizes", "8,32", "-f", "json")
    assert result.exit_code == 0, result.stderr
    assert "added the checkpoint's own patch size 16" in result.stderr
    [document] = json.loads(result.stdout)["results"]
    assert document["provenance"]["comparison"] == NOTE
    assert document["experiment"]["settings"] == {
        "patch_sizes": [8, 16, 32],
        "image_size": 224,
        "pad": False,
        "measure": False,
    }
    comparison = document["result"]
    assert comparison["comparison"] == NOTE
    variants = {entry["patch_size"]: entry for entry in comparison["variants"]}
    assert sorted(variants) == [8, 16, 32]
    assert variants[8]["scores_ratio_vs_native"] == pytest.approx(616_225 / 38_809)
    assert variants[8]["patch_scores_ratio_vs_native"] == 16
    for entry in variants.values():
        assert entry["macs_attention_counted"] == entry["macs_attention_closed_form"]
        assert entry["macs_total_counted"] == entry["macs_total_closed_form"]
    files = result_files(workdir / "outputs", "patch-sizes-p8_16_32-i224")
    assert files["json"].parent.name == "model"  # about the model alone: no image
    rows = read_csv(files["csv"])
    assert len(rows) == 3 and list(rows[0])[:6] == ["image", "image_sha256", "model", "weights", "result", "comparison"]
    assert {row["comparison"] for row in rows} == {NOTE} and {row["weights"] for row in rows} == {ARCHITECTURE_ONLY}
    assert json.loads(files["json"].read_text())["result"]["variants"][0]["patch_size"] == 8
    assert files["png"].read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_cli_measure_is_labelled_and_consistent(cli):
    result = cli(
        "compare-patch-size",
        "--model",
        "vit_tiny_patch16_224",
        "--image-size",
        "64",
        "--patch-sizes",
        "16,32",
        "--measure",
        "--runs",
        "3",
        "--warmup",
        "1",
        "--batch-size",
        "2",
        "--device",
        "cpu",
        "-f",
        "json",
    )
    assert result.exit_code == 0, result.stderr
    [document] = json.loads(result.stdout)["results"]
    assert document["experiment"]["name"] == "patch-sizes-p16_32-i64-measure-r3-w1"
    variants = {entry["patch_size"]: entry for entry in document["result"]["variants"]}
    for entry in variants.values():
        measurement = entry["measurement"]
        assert (measurement["batch_size"], measurement["runs"], measurement["warmup"]) == (2, 3, 1)
        assert measurement["median_latency_ms_per_image"] == pytest.approx(
            statistics.median(measurement["latencies_ms_per_batch"]) / 2
        )
        assert measurement["median_latency_ms_per_image"] > 0
        assert "tensors created during one forward" in measurement["memory_method"]
    # 17 rows against 5: every activation is bigger at patch 16.
    assert variants[16]["peak_memory_bytes"] > variants[32]["peak_memory_bytes"] > 0
    # The ratios, recomputed from the raw timings and peaks, are patch 32's against patch 16's.
    native, other = variants[16]["measurement"], variants[32]["measurement"]
    latency = statistics.median(other["latencies_ms_per_batch"]) / statistics.median(native["latencies_ms_per_batch"])
    assert variants[32]["latency_ratio_vs_native"] == pytest.approx(latency, rel=1e-12)
    assert variants[32]["peak_memory_ratio_vs_native"] == pytest.approx(
        other["peak_memory_bytes"] / native["peak_memory_bytes"], rel=1e-12
    )


def test_cli_adapt_is_labelled(cli, workdir, photo):
    result = cli("compare-patch-size", *RANDOM_CPU, "--adapt", photo, "--patch-sizes", "16,32")
    assert result.exit_code == 0, result.stderr
    flat = " ".join(result.stdout.split())
    assert ADAPTED_NOTE in flat and "RANDOM (seed 0)" in flat
    files = result_files(workdir / "outputs", "patch-sizes-p16_32-i224-adapted")
    assert files["json"].parent.name.startswith(photo.stem)  # about the image it ran on
    rows = read_csv(files["csv"])
    assert {"adapted", "top1_label", "top1_probability", "native_top1_probability"} <= set(rows[0])
    assert {(row["adapted"], row["weights"], row["image"]) for row in rows} == {
        (ADAPTED_NOTE, "RANDOM (seed 0)", str(photo))
    }


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--patch-sizes", "0"], "patch size must be between 1 and 224 (the image size), not 0"),
        (["--patch-sizes=-8"], "patch size must be between 1 and 224 (the image size), not -8"),
        (["--patch-sizes", "12"], "patch size 12 does not divide the 224-pixel image"),
        (["--patch-sizes", ""], "--patch-sizes is empty"),
        (["--patch-sizes", "8,x"], "'x' is not a whole number"),
        (
            ["--image-size", "40", "--patch-sizes", "8"],
            "the checkpoint's own patch size 16, which every ratio is taken against, does not divide",
        ),
    ],
)
def test_cli_bad_input(cli, arguments, message):
    result = cli("compare-patch-size", *arguments)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and message in result.stderr and result.stderr.count("\n") == 1
