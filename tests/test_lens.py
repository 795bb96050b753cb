"""Logit lens: every block's readouts against a block-by-block forward written here, and the last CLS readout
against the model's own logits."""

from __future__ import annotations

import csv
import io
import json

import pytest
import torch

from vitcli.experiments.lens import CLS, PATCH_MEAN, logit_lens
from vitcli.presentation import lens as presentation

from conftest import RANDOM_CPU, result_files, small_vit

# Readouts of the same rows through the same modules, batched differently: float32 rounding only.
PROBABILITY_TOLERANCE = 1e-6


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def registers():
    """DINOv2 ViT-S/14 with 4 register tokens, 2 blocks, 56x56: the patch mean must skip CLS and R1..R4."""
    return small_vit("vit_small_patch14_reg4_dinov2", depth=2, img_size=56, num_classes=10)


def block_by_block(net, image: torch.Tensor, prefix: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(CLS logits, patch-mean logits) after each block: the blocks run one at a time, the final norm and the
    classifier applied by hand to the CLS row and to the mean of the patch rows."""
    readouts = []
    with torch.inference_mode():
        rows = net.norm_pre(net._pos_embed(net.patch_embed(image[None])))
        for block in net.blocks:
            rows = block(rows)
            cls = net.head(net.norm(rows)[:, 0])
            mean = net.head(net.norm(rows[:, prefix:].mean(dim=1)))
            readouts.append((cls[0], mean[0]))
    return readouts


def probability_and_rank(logits: torch.Tensor, target: int) -> tuple[float, int]:
    order = logits.argsort(descending=True).tolist()
    return float(logits.softmax(dim=-1)[target]), order.index(target) + 1


@pytest.mark.parametrize("which", ["vit", "registers"])
def test_readouts_equal_a_block_by_block_forward(request, photo, which):
    model = request.getfixturevalue(which)
    prepared = model.prepare(photo)
    result = logit_lens(model, prepared, target="3")
    assert result.target.index == 3
    expected = block_by_block(model.net, prepared.input, model.grid.num_prefix)
    assert [row.block for row in result.series(CLS)] == list(range(1, model.depth + 1))
    for (cls, mean), ours_cls, ours_mean in zip(expected, result.series(CLS), result.series(PATCH_MEAN), strict=True):
        for logits, ours in ((cls, ours_cls), (mean, ours_mean)):
            probability, rank = probability_and_rank(logits, 3)
            assert ours.target_probability == pytest.approx(probability, abs=PROBABILITY_TOLERANCE)
            assert ours.target_rank == rank
            assert ours.top1.index == int(logits.argmax())


def test_last_cls_readout_equals_the_models_logits_exactly(vit, photo):
    prepared = vit.prepare(photo)
    result = logit_lens(vit, prepared)
    with torch.inference_mode():
        logits = vit.net(prepared.input[None])[0]
    probabilities = logits.softmax(dim=-1)
    last = result.series(CLS)[-1]
    assert result.final_difference == 0.0
    assert result.target.index == int(logits.argmax())  # default target: the model's top-1
    assert last.block == 12 and last.target_rank == 1
    assert last.target_probability == float(probabilities[result.target.index])  # exactly, not approximately
    assert last.top1.probability == float(probabilities.max())
    assert result.target.probability == last.target_probability


def test_presentation(vit, photo):
    result = logit_lens(vit, vit.prepare(photo))
    rows = presentation.rows(result)
    assert len(rows) == 2 * 12
    assert {row["readout"] for row in rows} == {CLS, PATCH_MEAN}
    document = json.loads(json.dumps(presentation.document(result)))
    assert document["self_check"]["max_abs_difference"] == 0.0
    summary = presentation.summary(result)
    cls = result.series(CLS)
    settled = next(row.block for row in cls if all(later.target_rank == 1 for later in cls[row.block - 1 :]))
    assert summary["lens_cls_top1_from_block"] == settled
    figure = presentation.figure(result)
    assert [len(panel.get_lines()) for panel in figure.axes] == [2, 2]
    assert "RANDOM (seed 0)" in figure._suptitle.get_text()


def test_lens_command(cli, workdir, photo):
    result = cli("lens", photo, *RANDOM_CPU, "--target", "256", "--format", "csv")
    assert result.exit_code == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 2 * 12 and {row["target_class"] for row in rows} == {"256"}
    files = result_files(workdir / "outputs", "lens-t256")
    assert set(files) == {"json", "csv", "png"}
    document = json.loads(files["json"].read_text())
    assert document["result"]["self_check"]["max_abs_difference"] == 0.0
    refused = cli("lens", photo, *RANDOM_CPU, "--target", "1000")
    assert refused.exit_code == 2 and "--target 1000 does not exist" in refused.stderr
