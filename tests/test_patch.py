"""Exactness tests of `vitcli patch`: identities a wrong patching must break, and explicit patched forwards written
here with timm's own modules (no hooks) as the oracle.

Most tests use a real timm ViT-Tiny cut to 3 blocks on a 64x64 input (a 4x4 grid + CLS), with layer scale and every
bias drawn non-zero, so that a site that forgot ls1/ls2 or a bias would show.
"""

from __future__ import annotations

import json
import re
import shutil
from contextlib import ExitStack

import numpy as np
import pytest
import torch
from scipy.stats import pearsonr, spearmanr

from vitcli.capture import pre_norm_refusal
from vitcli.errors import UsageError, VitcliError
from vitcli.experiments.patching import (
    Site,
    attribution_deltas,
    patch_images,
    patched_metric,
    patching,
    run_pair,
    sites_of,
)
from vitcli.presentation.patch_figure import residual_image

from conftest import RANDOM_CPU, result_files, small_vit

MODEL = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # small forwards; the cores are shared


def _biased(model):
    """Every bias of the net drawn from N(0, 0.1): zero biases would hide a site that drops one."""
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, parameter in model.net.named_parameters():
            if name.endswith("bias"):
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    return model


@pytest.fixture(scope="module")
def small():
    """ViT-Tiny, 3 blocks, 64x64 input, layer scale 0.5, non-zero biases; batches of 5 so batches straddle blocks."""
    model = _biased(small_vit(MODEL, depth=3, img_size=64, init_values=0.5))
    model.batch_size = 5
    return model


@pytest.fixture(scope="module")
def pair_images(small, newfoundland, persian):
    return small.prepare(newfoundland), small.prepare(persian)


@pytest.fixture(scope="module")
def pair(small, pair_images):
    clean, corrupt = pair_images
    return run_pair(small, clean.input, corrupt.input, gradients=True)


def _score(pair, values):
    return (values - pair.m_corrupt) / (pair.m_clean - pair.m_corrupt)


def test_patching_the_whole_residual_stream_at_any_block_restores_clean_exactly(small, pair):
    """Every row entering block b from CLEAN: the rest of the run is CLEAN's, score 1. Block 1 alone in its batch is
    the very computation of CLEAN's own run: bitwise 1. Several blocks in one batch of 3 rows: 1 to 1e-5 (float32
    matmuls round differently for 3 rows than for 1; on this CPU they gave 0.9999994).

    Seen to fail when the patch wrote one token fewer (`value[row, 1:]`) and when lerp's arguments were swapped."""
    alone = _score(pair, patched_metric(small, pair, [Site("residual", 1, None)]))
    assert float(alone) == 1.0
    sites = [Site("residual", block, None) for block in range(1, small.depth + 1)]
    scores = _score(pair, patched_metric(small, pair, sites))
    print(f"scores of the whole residual stream, one batch: {scores.tolist()}")
    assert torch.allclose(scores, torch.ones_like(scores), rtol=0, atol=1e-5)


def _explicit(net, corrupt_rows, clean_rows, site):
    """M-free oracle: the logits of CORRUPT with `site` taken from CLEAN, written out with timm's modules, no hooks.
    corrupt_rows / clean_rows: (1, tokens, D) rows entering block 1."""
    x, clean = corrupt_rows, clean_rows
    for number, block in enumerate(net.blocks, start=1):
        if number == site.block and site.kind == "residual":
            x = x.clone()
            x[:, site.index] = clean[:, site.index]
        if number != site.block or site.kind == "residual":
            x, clean = block(x), block(clean)
            continue
        attention_in, clean_attention_in = block.norm1(x), block.norm1(clean)
        if site.kind == "heads":
            width = block.attn.head_dim
            lo, hi = (site.index - 1) * width, site.index * width
            mixed, clean_mixed = _proj_input(block.attn, attention_in), _proj_input(block.attn, clean_attention_in)
            mixed[..., lo:hi] = clean_mixed[..., lo:hi]
            attention = block.attn.proj(mixed)
        else:
            attention = block.attn(clean_attention_in if site.kind == "attention" else attention_in)
        x = x + block.ls1(attention)
        mlp = block.mlp(block.norm2((clean + block.ls1(block.attn(clean_attention_in))) if site.kind == "mlp" else x))
        x = x + block.ls2(mlp)
        clean = block(clean)
    return net.forward_head(net.norm(x))


def _proj_input(attention, normed):
    """The input of attn.proj, written out: softmax(q k^T * scale) v per head, heads side by side."""
    batch, tokens, _ = normed.shape
    q, k, v = attention.qkv(normed).reshape(batch, tokens, 3, attention.num_heads, -1).permute(2, 0, 3, 1, 4)
    mixed = ((q @ k.transpose(-2, -1)) * attention.scale).softmax(-1) @ v
    return mixed.transpose(1, 2).reshape(batch, tokens, -1)


def test_batched_hooked_patching_equals_explicit_patched_forwards(small, pair_images, pair):
    """Every site of every kind (batches of 5 straddling blocks, runs starting at the earliest block) against a
    patched forward written out without hooks.

    Seen to fail when a batch started one block late (`start = min(block)`) and when the heads slice was off by one
    head (`index * head_dim`)."""
    net = small.net
    clean, corrupt = pair_images
    with torch.inference_mode():
        clean_rows, corrupt_rows = small.embed(clean.input[None]), small.embed(corrupt.input[None])
        for kind in ("residual", "attention", "mlp", "heads"):
            sites = sites_of(kind, small.depth, small.grid.num_tokens, small.num_heads)
            hooked = patched_metric(small, pair, sites)
            explicit = torch.stack([pair.metric(_explicit(net, corrupt_rows, clean_rows, site))[0] for site in sites])
            largest = float((hooked - explicit).abs().max())
            print(f"{kind}: {len(sites)} sites, largest |hooked - explicit| M {largest:.3g}")
            assert largest <= 1e-5


def test_every_head_of_a_block_at_once_equals_its_attention_output(small, pair):
    """attn.proj is linear: all heads' slices from CLEAN (its bias b_O, the same in both runs, added by proj) give
    CLEAN's attention output, so the two patches give the same M.

    Seen to fail when the heads slice was `index * head_dim` (heads counted from zero twice)."""
    net, heads = small.net, small.num_heads
    corrupt_rows = pair.corrupt["residual"][0][None]
    with torch.inference_mode():
        for block in range(1, small.depth + 1):
            with patching(net, [Site("attention", block)], pair.clean):
                attention = pair.metric(net.forward_head(net.norm(net.blocks(corrupt_rows))))
            with ExitStack() as stack:
                for head in range(1, heads + 1):  # one hook per head on the same row: they apply in turn
                    stack.enter_context(patching(net, [Site("heads", block, head)], pair.clean))
                every_head = pair.metric(net.forward_head(net.norm(net.blocks(corrupt_rows))))
            print(f"block {block}: attention {float(attention):+.6f}, every head {float(every_head):+.6f}")
            assert float(every_head) == pytest.approx(float(attention), abs=1e-6)
            assert abs(float(attention) - pair.m_corrupt) > 1e-4, "the patch must change M for the test to mean much"


def test_attribution_equals_a_finite_difference_of_activation_patching(newfoundland, persian):
    """In float64, the estimate (a_clean - a_corrupt) . dM/da equals the central difference
    (M(lerp alpha) - M(lerp -alpha)) / (2 alpha), alpha = 1e-4, to 1e-6 of the largest estimate, at every site.

    Seen to fail when the difference was a_corrupt - a_clean, and when the heads' features were grouped
    interleaved (`reshape(blocks, tokens, head_dim, heads)`)."""
    model = _biased(small_vit(MODEL, depth=3, img_size=64, init_values=0.5))
    model.net.double()
    clean, corrupt = model.prepare(newfoundland), model.prepare(persian)
    pair = run_pair(model, clean.input, corrupt.input, gradients=True)
    alpha = 1e-4
    for kind in ("residual", "attention", "mlp", "heads"):
        sites = sites_of(kind, model.depth, model.grid.num_tokens, model.num_heads)
        ahead, behind = patched_metric(model, pair, sites, alpha), patched_metric(model, pair, sites, -alpha)
        difference = (ahead - behind) / (2 * alpha)
        estimate = attribution_deltas(pair, kind).reshape(-1)
        scale = float(estimate.abs().max())
        largest = float((difference - estimate).abs().max())
        print(f"{kind}: largest |finite difference - estimate| {largest:.3g}, largest |estimate| {scale:.3g}")
        assert scale > 1e-3 and largest <= 1e-6 * scale


def test_clean_equal_to_corrupt_is_refused_without_dividing_by_zero(small, pair_images):
    """The same image twice: M_clean = M_corrupt exactly, refused (exit 1) before any patched forward.

    Seen to fail (no refusal: a table of NaN scores) when the check was removed."""
    clean, _ = pair_images
    with pytest.raises(VitcliError, match=r"M_clean = M_corrupt .* is undefined") as refused:
        patch_images(small, clean, clean)
    assert refused.value.exit_code == 1


def test_default_classes_target_clean_top1_contrast_corrupt_top1_or_its_second(small, pair_images):
    """Against the model's own logits, both branches of the contrast's rule.

    Seen to fail when the contrast was CLEAN's second instead of CORRUPT's."""
    clean, corrupt = pair_images
    with torch.inference_mode():
        clean_logits, corrupt_logits = small.net(torch.stack([clean.input, corrupt.input]))
    first, second = corrupt_logits.topk(2).indices.tolist()
    pair = run_pair(small, clean.input, corrupt.input)
    assert pair.target == int(clean_logits.argmax())
    assert pair.contrast == (first if first != pair.target else second)
    assert pair.m_clean == pytest.approx(float(clean_logits[pair.target] - clean_logits[pair.contrast]), abs=1e-5)
    for target, contrast, rule in ((first, second, "CORRUPT's second"), (second, first, "CORRUPT's top-1")):
        chosen = run_pair(small, clean.input, corrupt.input, target=target)
        assert (chosen.target, chosen.contrast) == (target, contrast) and chosen.contrast_rule.startswith(rule)
    with pytest.raises(UsageError, match="CLEAN's top-1, the default target"):
        run_pair(small, clean.input, corrupt.input, contrast=pair.target)


def test_result_scores_and_correlations(small, pair_images, pair):
    """The result's arrays are the patched metrics normalized, in block-major order; the correlations are scipy's.

    Seen to fail when correlations() returned Spearman's as Pearson's and the other way round."""
    clean, corrupt = pair_images
    result = patch_images(small, clean, corrupt, methods=("activation", "attribution"))
    heads = next(scores for scores in result.kinds if scores.kind == "heads")
    sites = sites_of("heads", small.depth, small.grid.num_tokens, small.num_heads)
    expected = _score(pair, patched_metric(small, pair, sites)).reshape(small.depth, small.num_heads).numpy()
    assert np.allclose(heads.activation, expected, atol=1e-6)
    assert heads.pearson == pytest.approx(pearsonr(heads.activation.ravel(), heads.attribution.ravel()).statistic)
    everything = [
        np.concatenate([np.ravel(getattr(s, m)) for s in result.kinds]) for m in ("activation", "attribution")
    ]
    assert result.spearman == pytest.approx(spearmanr(*everything).statistic)
    assert result.patched_forwards == small.depth * (small.grid.num_tokens + 2 + small.num_heads)


def test_sites_are_refused_on_blocks_without_attn_proj(small):
    """Seen to fail when REQUIRED_MODULES lacked attn.proj."""
    skeleton = small_vit(MODEL, depth=2, img_size=64).net
    assert pre_norm_refusal(skeleton, MODEL) is None
    del skeleton.blocks[1].attn.proj
    assert pre_norm_refusal(skeleton, MODEL).endswith("block 2 (Block) has no attn.proj")


def test_residual_image_puts_cls_beside_the_grid(small):
    """Seen to fail when the prefix tokens were drawn in the blank column (`grid.cols`)."""
    grid = small.grid
    scores = np.arange(grid.num_tokens, dtype=float)
    image = residual_image(grid, scores)
    assert image.shape == (grid.rows, grid.cols + 2)
    assert image[0, grid.cols + 1] == 0  # CLS
    assert image[0, 0] == 1 and image[1, 0] == grid.cols + 1  # P1, then the first patch of the second grid row
    assert np.isnan(image[:, grid.cols]).all() and np.isnan(image[1:, grid.cols + 1]).all()


# ----- the command


@pytest.fixture
def no_model_load(monkeypatch):
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["{dog}"], "patch needs exactly two images, CLEAN then CORRUPT; got 1"),
        (["{dog}", "{cat}", "{dog}"], "patch needs exactly two images, CLEAN then CORRUPT; got 3"),
        (
            ["{dog}", "{cat}", "--target", "256", "--contrast", "Newfoundland dog"],
            "--contrast Newfoundland dog is the target class 256",
        ),
        (["{dog}", "{dog}"], "CLEAN and CORRUPT are the same image"),
        (["{dog}", "{copy}"], "CLEAN and CORRUPT are the same image"),
        (
            ["{dog}", "{cat}", "--model", "vit_small_patch16_18x2_224"],
            "`patch` needs what vit_small_patch16_18x2_224 (timm VisionTransformer) lacks: no sites vitcli can "
            "replace (block 1 (ParallelThingsBlock) has no norm1, attn, attn.qkv, attn.proj",
        ),
    ],
    ids=["one image", "three images", "contrast = target", "same path", "same bytes", "no attn.proj"],
)
def test_usage_errors_are_one_line_and_exit_2_before_the_model_loads(
    cli, workdir, newfoundland, persian, no_model_load, arguments, message
):
    """Seen to fail (the model was loaded) when the count of images was not checked."""
    copy = workdir / "copy.jpg"
    shutil.copyfile(newfoundland, copy)
    names = {"dog": newfoundland, "cat": persian, "copy": copy}
    result = cli("patch", *(argument.format(**names) for argument in arguments), *RANDOM_CPU)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1 and message in result.stderr
    assert result.stdout == ""


def test_patch_command_on_the_default_model(cli, workdir, vit, newfoundland, persian):
    """The lecture's pair through ViT-Tiny: files, M against the model's own logits, scores and correlations
    consistent with each other. Seen to fail when the JSON's m_corrupt was M_clean."""
    result = cli(
        "patch", newfoundland, persian, *RANDOM_CPU, "--sites", "attention", "--method", "activation",
        "--method", "attribution", "-q",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    found = list((workdir / "outputs").glob("*/*/patch-from-newfoundland_31-*-ttop1-cauto-sattention-*.json"))
    assert len(found) == 1, found
    name = found[0].name.removesuffix(".json")
    files = result_files(workdir / "outputs", name)
    assert {"json", "csv", "png"} <= set(files)
    document = json.loads(files["json"].read_text())["result"]
    clean, corrupt = vit.prepare(newfoundland), vit.prepare(persian)
    with torch.inference_mode():
        logits = vit.net(torch.stack([clean.input, corrupt.input]))
    target, contrast = document["metric"]["target"]["index"], document["metric"]["contrast"]["index"]
    assert target == int(logits[0].argmax()) and contrast == int(logits[1].argmax())
    for side, row in (("m_clean", 0), ("m_corrupt", 1)):
        assert document["metric"][side] == pytest.approx(float(logits[row, target] - logits[row, contrast]), abs=1e-4)
    attention = document["sites"]["attention"]
    assert np.array(attention["activation"]).shape == (12,)
    assert attention["pearson"] == pytest.approx(pearsonr(attention["activation"], attention["attribution"]).statistic)
    assert len(files["csv"].read_text().strip().splitlines()) == 1 + 12


def test_patch_without_a_terminal_says_its_progress_in_a_line_per_tenth(cli, workdir, vit, newfoundland, persian):
    """stderr is not a terminal under CliRunner (a log file, a pipe, a batch job): no bar, plain lines instead."""
    result = cli("patch", newfoundland, persian, *RANDOM_CPU, "--sites", "heads", "--no-figures", "--batch-size", "4")
    assert result.exit_code == 0, result.stderr
    progress = re.findall(r"^patching heads: (\d+)% \((\d+) of 36\)$", result.stderr, re.MULTILINE)
    percents = [int(percent) for percent, _ in progress]
    assert percents == list(range(10, 101, 10)) or (percents[-1] == 100 and len(percents) >= 5), result.stderr
    assert all(int(percent) * 36 <= 100 * int(done) for percent, done in progress)  # never more than is done
    assert len(progress) == len(set(percents)) <= 10
    quiet = cli("patch", newfoundland, persian, *RANDOM_CPU, "--sites", "heads", "--no-figures", "-q")
    assert quiet.exit_code == 0 and "patching" not in quiet.stderr


def test_presentation_shows_what_the_result_holds(small, pair_images):
    """Rows, JSON and figure carry the result's arrays unchanged, heads and blocks counted from one.

    Seen to fail when the rows' heads counted from zero (`head = where[1]`)."""
    import matplotlib.pyplot as plt

    from vitcli.presentation import patch as view

    clean, corrupt = pair_images
    result = patch_images(small, clean, corrupt, methods=("activation", "attribution"))
    rows = view.rows(result)
    tokens, depth, heads = small.grid.num_tokens, small.depth, small.num_heads
    assert len(rows) == depth * (tokens + 2 + heads)
    scores = {scores.kind: scores for scores in result.kinds}
    for row in rows:
        where = row["block"] - 1 if row["kind"] in ("attention", "mlp") else None
        if row["kind"] == "heads":
            where = (row["block"] - 1, row["head"] - 1)
        elif row["kind"] == "residual":
            where = (row["block"] - 1, row["token"])
            assert row["token_name"] == ("CLS" if row["token"] == 0 else f"P{row['token']}")
        assert row["activation"] == float(scores[row["kind"]].activation[where])
        assert row["attribution"] == float(scores[row["kind"]].attribution[where])
    document = json.loads(json.dumps(view.document(result)))
    assert np.array_equal(np.array(document["sites"]["residual"]["activation"]), scores["residual"].activation)
    assert document["metric"]["m_clean"] == result.m_clean and document["token_names"][1] == "P1"
    figure = view.figure(result)
    heat_map = next(panel for panel in figure.axes if panel.get_title().startswith("heads"))
    assert np.array_equal(heat_map.images[0].get_array(), scores["heads"].activation)
    plt.close(figure)
    summary = view.summary(result)
    assert summary["patch_pearson"] == result.pearson
