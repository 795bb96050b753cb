"""Oracle tests of the trace: every kept row against forward-hook captures of timm's own modules and `model(x)`.

The expected value of each stage is taken here from the hooks (or from an independent computation: F.unfold for the
channel-major patch matrix, softmax of the captured q and k for the attention weights), never from the trace code.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from PIL import Image

from vitcli.errors import UsageError, VitcliError
from vitcli.experiments import trace as trace_module
from vitcli.experiments import trace_stages
from vitcli.experiments.trace import parse_blocks, parse_tokens, trace_image
from vitcli.model import VitModel
from vitcli.spec import WeightsSpec

from conftest import RANDOM_CPU, result_files

TOLERANCE = 1e-5  # the bound for every followed value against the hook capture and model(x)


@pytest.fixture(scope="module")
def odd_vit() -> VitModel:
    """Patch 32 at 384 input, with every optional piece timm's Block can have: LayerScale, q/k norm, the attention
    and MLP norms, a patch-embedding norm, a pre-block norm, two register tokens (no position embedding for the
    prefix), mean pooling with fc_norm. Norm parameters are randomized so that a skipped or repeated norm shows."""
    torch.manual_seed(3)
    net = timm.create_model(
        "vit_small_patch32_384", pretrained=False, depth=2, init_values=0.1, qk_norm=True, scale_attn_norm=True,
        scale_mlp_norm=True, reg_tokens=2, no_embed_class=True, global_pool="avg", pre_norm=True,
        embed_norm_layer="layernorm",
    )  # fmt: skip
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.copy_(1 + 0.2 * torch.randn_like(module.weight))
                module.bias.copy_(0.2 * torch.randn_like(module.bias))
        for block in net.blocks:
            for scale in (block.ls1, block.ls2):
                scale.gamma.copy_(0.5 * torch.randn_like(scale.gamma))
    return VitModel(net, WeightsSpec(model_name="vit_small_patch32_384", random=True, seed=3), torch.device("cpu"), 8)


def hook_captures(net, x):
    """name -> (first input, output) of every module during the model's own forward, and its logits."""
    captures, handles = {}, []
    for name, module in net.named_modules():
        if name:
            handles.append(
                module.register_forward_hook(
                    lambda m, args, out, name=name: captures.__setitem__(name, (args[0][0].clone(), out[0].clone()))
                )
            )
    with torch.inference_mode():
        logits = net(x)[0]
    for handle in handles:
        handle.remove()
    return captures, logits


def expected_rows(model: VitModel, image, x, captures, logits, stage) -> dict[str, torch.Tensor]:
    """What each kept row must be, from the hooks and independent computations."""
    net, grid = model.net, model.grid
    out = {name: captured[1] for name, captured in captures.items()}
    inp = {name: captured[0] for name, captured in captures.items()}
    key = stage.key
    if key.startswith("image."):
        whole = {
            "image.decoded": torch.from_numpy(np.array(Image.open(image.source.path).convert("RGB"))),
            "image.crop": torch.from_numpy(image.crop_uint8()),
            "image.normalized": image.input,
        }[key]
        return {"": whole.reshape(-1)[: len(stage.values)].float()}
    if key == "embed.pixels":
        table = F.unfold(x, grid.patch_size, stride=grid.patch_size)[0].T  # (patches, 3 p^2), channel-major
    elif key == "embed.projection":
        table = out["patch_embed.proj"].flatten(1).T
    elif key == "embed.norm":
        table = out["patch_embed"]
    elif key == "embed.prefix":
        table = torch.cat([net.cls_token[0], net.reg_token[0]]) if net.reg_token is not None else net.cls_token[0]
        table = table.detach()
    elif key == "embed.position":
        table = net.pos_embed[0].detach()
    elif key == "embed.tokens":
        table = out["pos_drop"]
    elif key == "embed.norm_pre":
        table = out["norm_pre"]
    elif key.startswith("block"):
        number, _, rest = key.removeprefix("block").partition(".")
        prefix = f"blocks.{int(number) - 1}"
        attention = net.blocks[int(number) - 1].attn
        heads, head_dim = attention.num_heads, attention.head_dim
        qkv = out[f"{prefix}.attn.qkv"].reshape(-1, 3, heads, head_dim).permute(1, 2, 0, 3)
        q = out[f"{prefix}.attn.q_norm"] if f"{prefix}.attn.q_norm" in out else qkv[0]
        k = out[f"{prefix}.attn.k_norm"] if f"{prefix}.attn.k_norm" in out else qkv[1]
        if rest.startswith("head"):
            head_text, _, part = rest.partition(".")
            head = int(head_text.removeprefix("head")) - 1
            table = {
                "q": q[head],
                "k": k[head],
                "v": qkv[2][head],
                "attention": torch.softmax(q[head] @ k[head].T / head_dim**0.5, dim=-1),
                "message": inp[f"{prefix}.attn.norm"][:, head * head_dim : (head + 1) * head_dim],
            }[part]
        else:
            table = {
                "norm1": out.get(f"{prefix}.norm1"),
                "attn.joined": inp[f"{prefix}.attn.norm"],
                "attn.norm": out[f"{prefix}.attn.norm"],
                "attn.proj": out[f"{prefix}.attn.proj"],
                "ls1": out[f"{prefix}.ls1"],
                "residual1": inp[f"{prefix}.norm2"],
                "norm2": out[f"{prefix}.norm2"],
                "mlp.fc1": out[f"{prefix}.mlp.fc1"],
                "mlp.act": out[f"{prefix}.mlp.act"],
                "mlp.norm": out[f"{prefix}.mlp.norm"],
                "mlp.fc2": out[f"{prefix}.mlp.fc2"],
                "ls2": out[f"{prefix}.ls2"],
                "output": out[prefix],
            }[rest]
    elif key == "final.norm":
        table = out["norm"]
    elif key == "final.pooled":
        return {"": inp["fc_norm"]}
    elif key == "final.fc_norm":
        return {"": out["fc_norm"]}
    elif key == "head.logits":
        return {"": logits}
    elif key == "head.softmax":
        return {"": logits.softmax(-1)}
    else:
        raise AssertionError(f"the test has no oracle for stage {key}")
    rows = {}
    for name in stage.rows:
        if key == "embed.pixels" or key.startswith("embed.projection") or key == "embed.norm":
            rows[name] = table[int(name[1:]) - 1]
        elif key == "embed.position" and net.no_embed_class:
            rows[name] = table[int(name[1:]) - 1]
        else:
            rows[name] = table[_token(grid, name)]
    return rows


def _token(grid, name: str) -> int:
    if name in grid.prefix_names:
        return grid.prefix_names.index(name)
    return grid.token_of_patch(int(name[1:]))


def check_against_hooks(model: VitModel, path, token_texts: list[str]) -> tuple[tuple[float, str], set[str]]:
    """Trace with every block opened; returns the largest difference (and its stage) and the stage keys."""
    image = model.prepare(path)
    followed = parse_tokens(model.grid, token_texts)
    result = trace_image(model, image, followed, list(range(1, model.depth + 1)))
    x = image.input.unsqueeze(0)
    captures, logits = hook_captures(model.net, x)
    worst, keys = [(0.0, "")], set()
    for stage in result.stages:
        keys.add(stage.key)
        expected = expected_rows(model, image, x, captures, logits, stage)
        if stage.rows is None:
            difference = (torch.tensor(stage.values) - expected[""].reshape(-1)).abs().max()
        else:
            assert stage.rows.keys() == expected.keys()
            difference = max(
                (torch.tensor(row) - expected[name].reshape(-1)).abs().max() for name, row in stage.rows.items()
            )
        assert difference <= TOLERANCE, f"{stage.key} differs from the hook capture by {difference}"
        worst.append((float(difference), stage.key))
    for summary in result.blocks:
        captured = captures[f"blocks.{summary.block - 1}"][1]
        for name, row in summary.output_rows.items():
            target = captured[_token(model.grid, name)]
            assert torch.allclose(torch.tensor(row), target, atol=TOLERANCE, rtol=0)
            assert summary.norms[name] == pytest.approx(float(target.norm()), rel=1e-5)
    assert torch.allclose(torch.tensor(result.stages[-2].values), logits, atol=TOLERANCE, rtol=0)
    assert result.logits_error <= TOLERANCE and result.max_error <= TOLERANCE
    return max(worst), keys


def test_every_followed_vector_equals_the_hook_capture_on_vit_tiny(vit, photo):
    largest, keys = check_against_hooks(vit, photo, ["0,63,r4c6,74"])
    assert {"embed.pixels", "block1.head3.attention", "block12.mlp.act", "head.softmax"} <= keys
    print(f"ViT-Tiny largest |trace - hook| = {largest[0]:.3g} at {largest[1]}")


def test_every_followed_vector_equals_the_hook_capture_on_patch32_384_with_every_option(odd_vit, photo):
    largest, keys = check_against_hooks(odd_vit, photo, ["cls,r2,P1,144"])
    optional = {"embed.norm", "embed.norm_pre", "block1.attn.norm", "block1.ls1", "block1.mlp.norm", "final.fc_norm"}
    assert optional <= keys
    print(f"patch-32/384 variant largest |trace - hook| = {largest[0]:.3g} at {largest[1]}")


def test_stage_shapes_follow_the_lecture(vit, photo):
    result = trace_image(vit, vit.prepare(photo), parse_tokens(vit.grid, ["cls"]), [1])
    shapes = {stage.key: stage.shape for stage in result.stages}
    assert shapes["image.crop"] == (224, 224, 3)
    assert shapes["embed.pixels"] == (196, 768) and shapes["embed.projection"] == (196, 192)
    assert shapes["embed.tokens"] == (197, 192) and shapes["block1.head1.q"] == (197, 64)
    assert shapes["block1.head2.attention"] == (197, 197) and shapes["block1.mlp.fc1"] == (197, 768)
    assert shapes["head.logits"] == (1000,)
    assert not any(key.startswith("block2.") for key in shapes), "only block 1 is opened"
    assert len(result.blocks) == 12
    assert result.stages[0].values is not None and len(result.stages[0].values) == trace_stages.LEADING_KEPT
    # The CLS input is the class token parameter plus its position vector, identical for every image.
    rows = {stage.key: stage.rows for stage in result.stages if stage.rows}
    cls_input = vit.net.cls_token[0, 0] + vit.net.pos_embed[0, 0]
    assert torch.allclose(torch.tensor(rows["embed.tokens"]["CLS"]), cls_input.detach(), atol=1e-7)
    # Summary lines: cosine of each output row with the row entering the block, computed here independently.
    cosines = [result.blocks[0].cosine_to_previous["CLS"]] + [s.cosine_to_previous["CLS"] for s in result.blocks[1:]]
    states = [cls_input.detach()] + [torch.tensor(s.output_rows["CLS"]) for s in result.blocks]
    for index, cosine in enumerate(cosines):
        assert cosine == pytest.approx(float(F.cosine_similarity(states[index + 1], states[index], dim=0)), abs=1e-6)
    first = states[1]
    for index, cosine in enumerate(result.cls_cosine_to_block1):
        assert cosine == pytest.approx(float(F.cosine_similarity(states[index + 1], first, dim=0)), abs=1e-6)


def test_a_failed_self_check_is_an_error(vit, photo, monkeypatch):
    monkeypatch.setattr(trace_module, "SELF_CHECK_TOLERANCE", 0.0)
    with pytest.raises(VitcliError, match="self-check failed"):
        trace_image(vit, vit.prepare(photo), parse_tokens(vit.grid, []), [])


def test_token_and_block_parsing(vit, odd_vit):
    tokens = parse_tokens(vit.grid, ["0,63,74", "cls", "P63", "r4c6"])
    assert [(t.token, t.name) for t in tokens] == [(0, "CLS"), (63, "P63"), (74, "P74")]
    registers = parse_tokens(odd_vit.grid, ["r1", "1"])
    assert [(t.token, t.name) for t in registers] == [(1, "R1"), (3, "P1")]  # CLS, R1, R2, then P1
    assert parse_tokens(vit.grid, []) == parse_tokens(vit.grid, ["cls"])
    for bad in ("P197", "r14c0", "dist", "x"):
        with pytest.raises(UsageError, match="--token"):
            parse_tokens(vit.grid, [bad])
    assert parse_blocks(12, ["1"]) == [1]
    assert parse_blocks(12, ["1,12", "3-5"]) == [1, 3, 4, 5, 12]
    assert parse_blocks(12, ["all"]) == list(range(1, 13)) and parse_blocks(12, ["none"]) == []
    for bad in ("0", "13", "5-3", "x"):
        with pytest.raises(UsageError, match="--blocks"):
            parse_blocks(12, [bad])


def test_models_whose_forward_differs_are_refused():
    torch.manual_seed(0)
    net = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1, global_pool="max")
    with pytest.raises(VitcliError, match="pooling"):
        trace_module.require_traceable(net, "max-pooled")
    distilled = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, depth=1)
    with pytest.raises(VitcliError, match="VisionTransformerDistilled"):
        trace_module.require_traceable(distilled, "deit")


def test_presentation_shows_what_the_result_holds(vit, photo):
    import json

    import matplotlib.pyplot as plt
    from rich.console import Console

    from vitcli.presentation import trace as view

    result = trace_image(vit, vit.prepare(photo), parse_tokens(vit.grid, ["0,63"]), [1], shown_values=4)
    console = Console(record=True, width=220)
    console.print(view.table(result))
    text = console.export_text()
    assert "RANDOM (seed 0) WEIGHTS" in text and "block 1: attention weights" in text and "P63 " in text
    assert f"{result.max_error:.3g}" in text
    rows = view.rows(result)
    assert len({tuple(row) for row in rows}) == 1, "every CSV row has the same columns"
    assert not {"image", "model", "weights"} & set(rows[0]), "the publisher adds these"
    by_stage = {(row["stage"], row["token"]): row for row in rows}
    norm1 = next(stage for stage in result.stages if stage.key == "block1.norm1")
    row = by_stage[("block1.norm1", "P63")]
    assert [row[f"value_{index}"] for index in range(4)] == norm1.rows["P63"][:4]
    assert row["norm"] == pytest.approx(float(torch.tensor(norm1.rows["P63"]).norm()), rel=1e-6)
    document = json.loads(json.dumps(view.document(result)))
    stages = {stage["key"]: stage for stage in document["stages"]}
    assert len(stages["block1.mlp.fc1"]["rows"]["CLS"]) == 768 and len(stages["head.logits"]["values"]) == 1000
    assert stages["image.crop"]["values_complete"] is False and stages["head.softmax"]["values_complete"] is True
    figure = view.figure(result)
    norms, cosines = figure.axes[:2]
    expected = [result.embedding_norms["P63"]] + [summary.norms["P63"] for summary in result.blocks]
    assert np.allclose(norms.lines[1].get_ydata(), expected)
    assert np.allclose(cosines.lines[0].get_ydata(), result.cls_cosine_to_block1)
    plt.close(figure)
    assert set(view.summary(result)) == {
        "trace_top1_class", "trace_top1_label", "trace_top1_probability", "trace_cls_cosine_last_vs_block1",
        "trace_max_abs_error",
    }  # fmt: skip


def test_trace_command(cli, workdir, vit, photo):
    result = cli("trace", photo, *RANDOM_CPU, "--token", "0,63", "--blocks", "1,12", "--values", "4", "-q")
    assert result.exit_code == 0, result.stderr
    files = result_files(workdir / "outputs", "trace-tCLS_P63-b1_12-v4")
    assert {"json", "csv", "png"} <= set(files)
    document = json.loads(files["json"].read_text())
    assert document["experiment"]["settings"]["blocks"] == [1, 12]
    stages = {stage["key"]: stage for stage in document["result"]["stages"]}
    assert "block12.head3.attention" in stages and "block2.norm1" not in stages
    with torch.inference_mode():
        logits = vit.net(vit.prepare(photo).input.unsqueeze(0))[0]
    assert torch.allclose(torch.tensor(stages["head.logits"]["values"]), logits, atol=TOLERANCE, rtol=0)
    header = files["csv"].read_text().splitlines()[0].split(",")
    assert header[:5] == ["image", "image_sha256", "model", "weights", "result"] and "value_3" in header
    for arguments, message in (
        (["--token", "P197"], "--token P197"),
        (["--blocks", "13"], "--blocks 13"),
        (["--values", "0"], "--values"),
    ):
        refused = cli("trace", photo, *RANDOM_CPU, *arguments)
        assert refused.exit_code == 2 and message in refused.stderr


def held_values(result) -> tuple[int, int]:
    """(values kept in full, table and CSV rows) of a trace result, counted from what it holds."""
    kept = rows = 0
    for stage in result.stages:
        vectors = list(stage.rows.values()) if stage.rows is not None else [stage.values]
        kept += sum(len(vector) for vector in vectors)
        rows += len(vectors)
    for summary in result.blocks:
        kept += sum(len(row) for row in summary.output_rows.values())
        rows += len(summary.output_rows)
    return kept, rows


@pytest.mark.parametrize(
    ("model", "tokens", "blocks"),
    [("vit", "0,63", "1,12"), ("vit", "r4c6", "all"), ("odd_vit", "0,r1,3", "all"), ("odd_vit", "5", "none")],
)
def test_the_size_told_before_loading_bounds_what_a_trace_holds(request, photo, model, tokens, blocks):
    from vitcli.experiments.trace_bound import trace_size

    vit_model = request.getfixturevalue(model)
    followed, opened = parse_tokens(vit_model.grid, [tokens]), parse_blocks(len(vit_model.net.blocks), [blocks])
    result = trace_image(vit_model, vit_model.prepare(photo), followed, opened, 4)
    kept, rows = held_values(result)
    size = trace_size(vit_model.net, vit_model.grid, len(vit_model.labels), len(followed), len(opened), 4)
    assert kept <= size.kept <= 1.1 * kept and rows <= size.rows <= 1.1 * rows


def test_the_lectures_traces_fit_the_bound():
    from vitcli.experiments.trace_bound import TRACE_VALUE_BOUND, trace_size
    from vitcli.loading import describe, require_vit

    architecture = describe(WeightsSpec(random=True))
    skeleton = require_vit(architecture.name)
    # docs/commands/trace.md's and the README's examples; one row through everything at the most values; every
    # token through one block; 20 tokens through every block
    for tokens, opened, values in ((3, 2, 5), (1, 12, 3), (2, 1, 3), (1, 12, 1000), (197, 1, 3), (20, 12, 3)):
        assert trace_size(skeleton, architecture.grid, 1000, tokens, opened, values).total <= TRACE_VALUE_BOUND, (
            tokens,
            opened,
            values,
        )


def test_a_trace_above_the_bound_is_refused_with_its_arithmetic_before_the_model_loads(cli, photo, monkeypatch):
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    every_token = ",".join(str(token) for token in range(197))
    result = cli("trace", photo, *RANDOM_CPU, "--token", every_token, "--blocks", "all", "--values", "1000")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: trace: 197 tokens x 12 opened blocks would hold up to ")
    assert "above the bound of 2,000,000; pass fewer --token, --blocks or --values" in lines[0]
    total = int(lines[0].split("would hold up to ")[1].split(" ")[0].replace(",", ""))
    assert total > 60_000_000  # the case held about 75 million values
    forty = ",".join(str(token) for token in range(40))
    refused = cli("trace", photo, *RANDOM_CPU, "--token", forty, "--blocks", "all")
    assert refused.exit_code == 2 and "trace: 40 tokens x 12 opened blocks" in refused.stderr
