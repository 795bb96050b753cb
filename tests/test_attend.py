"""vitcli attend: explicit attention weights against an independent path, grid numbering, rollout, and the CLI.

The oracle is timm's own attention with the fused kernel switched off: forward hooks on `attn.attn_drop` (an
identity in eval mode) receive the softmax weights. It shares nothing with `VitModel.trace`.
"""

from __future__ import annotations

import copy
import csv
import functools
import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from vitcli.errors import UsageError
from vitcli.experiments import attention as core
from vitcli.experiments.attention_summary import summarize
from vitcli.experiments.rollout import attention_rollout, rollout
from vitcli.grid import PatchGrid
from vitcli.presentation import attention as view

from conftest import RANDOM_CPU, result_files

# Independent float32 paths through the same weights: softmax outputs agree far below this.
WEIGHT_TOLERANCE = 1e-6
PATCH32 = "vit_small_patch32_224"
TINY384 = "vit_tiny_patch16_384"
DISTILLED = "deit_tiny_distilled_patch16_224"


def extra_model(name: str):
    from vitcli.loading import load_model
    from vitcli.spec import WeightsSpec

    return load_model(WeightsSpec(model_name=name, random=True, seed=0), "cpu", 8)


@pytest.fixture(scope="module")
def patch32():
    return extra_model(PATCH32)


@pytest.fixture(scope="module")
def tiny384():
    return extra_model(TINY384)


@pytest.fixture(scope="module")
def distilled():
    return extra_model(DISTILLED)


@functools.cache
def oracle_attention(model, photo: Path) -> torch.Tensor:
    """(blocks, heads, N, N) softmax weights of timm's unfused attention on a deep copy of the net."""
    net = copy.deepcopy(model.net)
    captured = []
    for block in net.blocks:
        block.attn.fused_attn = False
        block.attn.attn_drop.register_forward_hook(lambda _module, _args, output: captured.append(output[0].detach()))
    with torch.no_grad():
        net(model.prepare(photo).input.unsqueeze(0))
    return torch.stack(captured)


def image_result(root: Path, image: Path, name: str, suffix: str) -> Path:
    """The file of result `name` for one image under an output folder (ROOT/MODEL/IMAGE-HASH/NAME.SUFFIX)."""
    (found,) = root.glob(f"*/{image.stem}-*/{name}.{suffix}")
    return found


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as stream:
        return list(csv.DictReader(stream))


# ----- the explicit weights


@pytest.mark.parametrize("name", ["vit", "patch32", "tiny384", "distilled"])
def test_explicit_weights_equal_timm_unfused_attention_in_every_block(name, request, photo):
    model = request.getfixturevalue(name)
    oracle = oracle_attention(model, photo)
    blocks = list(range(1, model.depth + 1))
    (checked,) = list(core.checked_traces(model, [model.prepare(photo)], blocks))
    assert oracle.shape == (
        model.depth,
        model.num_heads,
        model.grid.num_tokens,
        model.grid.num_tokens,
    )
    for block in blocks:
        attention = checked.attention[block]
        assert torch.allclose(attention, oracle[block - 1], rtol=0, atol=WEIGHT_TOLERANCE), f"block {block}"
        assert torch.allclose(
            attention.double().sum(dim=-1),
            torch.ones(attention.shape[:-1], dtype=torch.float64),
            atol=1e-6,
        )
        assert 0 <= checked.self_check[block] <= core.SELF_CHECK_TOLERANCE


def test_checks_run_once_per_batch_and_block(vit, photo, newfoundland, monkeypatch):
    """Three images, two to a batch: each kept block's attention module runs once per batch for the self-check,
    and each image gets its own rows of the batch."""
    images = [vit.prepare(path) for path in (photo, newfoundland, photo)]
    monkeypatch.setattr(vit, "batch_size", 2)
    calls = []
    handles = [
        vit.net.blocks[index].attn.register_forward_hook(
            lambda _module, args, _output, index=index: calls.append((index, len(args[0])))
        )
        for index in (1, 3)
    ]
    try:
        checked = list(core.checked_traces(vit, images, [2, 4]))
    finally:
        for handle in handles:
            handle.remove()
    assert calls == [(1, 2), (3, 2), (1, 1), (3, 1)]
    assert [sorted(image.attention) for image in checked] == [[2, 4]] * 3
    for image, path in zip(checked, (photo, newfoundland, photo), strict=True):
        oracle = oracle_attention(vit, path)
        for block in (2, 4):
            assert torch.allclose(image.attention[block], oracle[block - 1], rtol=0, atol=WEIGHT_TOLERANCE)


def test_attend_returns_the_query_row_of_each_block_and_head(vit, photo):
    oracle = oracle_attention(vit, photo)
    query = core.parse_query(vit.grid, "P74")
    (result,) = core.attend(vit, [vit.prepare(photo)], query, blocks=[2, 4], heads=[1, 3])
    assert [(row.block, row.head) for row in result.maps] == [
        (2, 1),
        (2, 3),
        (4, 1),
        (4, 3),
    ]
    for row in result.maps:
        assert torch.allclose(
            row.attention,
            oracle[row.block - 1, row.head - 1, 74],
            rtol=0,
            atol=WEIGHT_TOLERANCE,
        )
        assert row.total == pytest.approx(1.0, abs=1e-6)


# ----- numbering on other grids


def test_query_forms_resolve_to_the_same_token():
    grid = PatchGrid(224, 224, 16)
    for text in ("74", "P74", "p74", "r5c3", " R5C3 "):
        assert core.parse_query(grid, text) == core.Query(74, "P74", 74, 5, 3)
    assert core.parse_query(grid, "cls") == core.Query(0, "CLS", None, None, None)


@pytest.mark.parametrize(
    ("grid", "text", "token", "row", "col"),
    [
        (PatchGrid(224, 224, 32), "r2c3", 18, 2, 3),  # 7x7: 2 * 7 + 3 + 1
        (PatchGrid(224, 224, 32), "P49", 49, 6, 6),
        (PatchGrid(384, 384, 16), "r5c3", 124, 5, 3),  # 24x24: 5 * 24 + 3 + 1
        (PatchGrid(384, 384, 16), "576", 576, 23, 23),
        (
            PatchGrid(224, 224, 16, ("CLS", "DIST")),
            "P1",
            2,
            0,
            0,
        ),  # the distillation token sits before the patches
    ],
)
def test_queries_follow_the_grid(grid, text, token, row, col):
    query = core.parse_query(grid, text)
    assert (query.token, query.row, query.col) == (token, row, col)


def test_prefix_tokens_are_queries_by_name():
    grid = PatchGrid(224, 224, 16, ("CLS", "DIST"))
    assert core.parse_query(grid, "dist").token == 1
    assert core.parse_query(grid, "CLS").token == 0


@pytest.mark.parametrize("text", ["0", "197", "-1", "P300", "r14c0", "P", "head"])
def test_bad_queries_name_the_valid_range(text):
    with pytest.raises(UsageError, match=r"P1\.\.P196 or r0c0\.\.r13c13; or cls for the class token"):
        core.parse_query(PatchGrid(224, 224, 16), text)


@pytest.mark.parametrize(
    ("name", "side", "prefix"),
    [
        ("patch32", 7, 1),
        ("tiny384", 24, 1),
        ("distilled", 14, 2),
    ],  # prefix: CLS (+ DIST)
)
def test_maps_follow_the_grid(name, side, prefix, request, photo):
    model = request.getfixturevalue(name)
    oracle = oracle_attention(model, photo)
    query = core.parse_query(model.grid, "r2c3")
    assert query.token == prefix + 2 * side + 3
    (result,) = core.attend(model, [model.prepare(photo)], query, blocks=[3], heads=[2])
    values = core.patch_map(model.grid, result.maps[0].attention)
    assert values.shape == (side, side)
    for row in range(side):
        for col in range(side):
            token = prefix + row * side + col
            assert values[row, col] == pytest.approx(float(oracle[2, 1, query.token, token]), abs=WEIGHT_TOLERANCE)
    rows = view.rows(result)
    assert len(rows) == prefix + side * side
    assert all((entry["row"], entry["col"]) == divmod(entry["token"] - prefix, side) for entry in rows[prefix:])
    assert [entry["patch"] for entry in rows[: prefix + 1]] == ["CLS", "DIST", "P1"][:prefix] + ["P1"]


# ----- summary


def test_summary_of_one_query_matches_hand_statistics(vit, photo):
    oracle = oracle_attention(vit, photo).double().numpy()
    (result,) = summarize(vit, [vit.prepare(photo)], core.parse_query(vit.grid, "r5c3"))
    assert [(row.block, row.head) for row in result.entries] == [(b, h) for b in range(1, 13) for h in range(1, 4)]
    for row in result.entries:
        weights = oracle[row.block - 1, row.head - 1, 74]
        assert row.cls_mass == pytest.approx(weights[0], abs=1e-7)
        assert row.entropy_bits == pytest.approx(-(weights * np.log2(weights)).sum(), abs=1e-5)
        patches = weights[1:]
        distances = [math.hypot(r - 5, c - 3) for r in range(14) for c in range(14)]
        assert row.mean_distance == pytest.approx((patches * distances).sum() / patches.sum(), abs=1e-5)
        assert row.top_token == int(weights.argmax())


def test_summary_over_all_queries_averages_rows(vit, photo):
    oracle = oracle_attention(vit, photo).double().numpy()
    (result,) = summarize(vit, [vit.prepare(photo)], None)
    row = result.entries[3 * 5 + 1]  # block 6, head 2
    assert (row.block, row.head) == (6, 2)
    weights = oracle[5, 1]
    assert row.cls_mass == pytest.approx(weights[:, 0].mean(), abs=1e-7)
    assert row.entropy_bits == pytest.approx((-(weights * np.log2(weights)).sum(axis=1)).mean(), abs=1e-5)
    assert row.top_token == int(weights.mean(axis=0).argmax())
    positions = np.array([divmod(patch - 1, 14) for patch in range(1, 197)])
    distances = np.hypot(*(positions[:, None, :] - positions[None, :, :]).transpose(2, 0, 1))
    patch_rows = weights[1:, 1:]
    expected = ((patch_rows * distances).sum(axis=1) / patch_rows.sum(axis=1)).mean()
    assert row.mean_distance == pytest.approx(expected, abs=1e-5)


# ----- rollout


def as_tensor(matrices) -> torch.Tensor:
    return torch.tensor(
        [[[float(value) for value in row] for row in matrix] for matrix in matrices],
        dtype=torch.float64,
    )


def test_rollout_of_two_blocks_by_hand():
    half, quarter = Fraction(1, 2), Fraction(1, 4)
    first = [[half, half, 0], [0, 1, 0], [0, half, half]]
    second = [[0, half, half], [1, 0, 0], [0, 0, 1]]
    # (W + I) / 2 per block: A1 = [[3/4, 1/4, 0], [0, 1, 0], [0, 1/4, 3/4]],
    # A2 = [[1/2, 1/4, 1/4], [1/2, 1/2, 0], [0, 0, 1]].
    # Rollout = A2 @ A1, worked out by hand.
    expected = [
        [Fraction(3, 8), Fraction(7, 16), Fraction(3, 16)],
        [Fraction(3, 8), Fraction(5, 8), 0],
        [0, quarter, Fraction(3, 4)],
    ]
    attention = as_tensor([first, second]).unsqueeze(1)  # one head per block
    assert torch.allclose(attention_rollout(attention), as_tensor([expected])[0], atol=1e-12)


@pytest.mark.parametrize(
    ("fusion", "expected_first_row"),
    [
        (
            "mean",
            [Fraction(3, 4), Fraction(1, 8), Fraction(1, 8)],
        ),  # ([1/2, 1/4, 1/4] + [1, 0, 0]) / 2
        (
            "max",
            [Fraction(3, 5), Fraction(1, 5), Fraction(1, 5)],
        ),  # [3/2, 1/2, 1/2] / (5/2)
        ("min", [1, 0, 0]),  # [3/2, 0, 0] / (3/2)
    ],
)
def test_rollout_head_fusion_by_hand(fusion, expected_first_row):
    identity = [[1, 0, 0], [0, 1, 0], [0, 0, 1]]
    heads = as_tensor([[[0.5, 0.5, 0], [0, 1, 0], [0, 0, 1]], [[0.5, 0, 0.5], [0, 1, 0], [0, 0, 1]]])
    rolled = attention_rollout(heads.unsqueeze(0), fusion)
    assert torch.allclose(rolled[0], as_tensor([[expected_first_row]])[0, 0], atol=1e-12)
    assert torch.allclose(rolled[1:], as_tensor([identity])[0, 1:], atol=1e-12)


def test_rollout_discard_keeps_the_cls_column_by_hand():
    weights = [[0.2, 0.3, 0.5], [0.6, 0.1, 0.3], [0.1, 0.3, 0.6]]
    # floor(0.34 * 3) = 1 weight dropped per row: the smallest outside the CLS column (row 3 keeps CLS's 0.1).
    expected = [
        [12 / 17, 0, 5 / 17],
        [0.6 / 1.9, 1 / 1.9, 0.3 / 1.9],
        [1 / 17, 0, 16 / 17],
    ]
    rolled = attention_rollout(as_tensor([weights]).unsqueeze(0), "mean", 0.34)
    assert torch.allclose(rolled, as_tensor([expected])[0], atol=1e-12)


def test_rollout_of_the_model_rolls_out_the_oracle_weights(vit, photo):
    oracle = oracle_attention(vit, photo)
    (result,) = rollout(vit, [vit.prepare(photo)], core.parse_query(vit.grid, "cls"), "max", 0.5)
    expected = attention_rollout(oracle, "max", 0.5)[0]
    assert torch.allclose(result.row, expected, atol=1e-6)
    assert float(result.row.sum()) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize(
    ("fusion", "ratio", "message"),
    [("median", 0.0, "mean, max, min"), ("mean", 1.0, "below 1")],
)
def test_rollout_refuses_bad_options(fusion, ratio, message):
    with pytest.raises(UsageError, match=message):
        attention_rollout(torch.ones(1, 1, 2, 2) / 2, fusion, ratio)


# ----- the command

PREFIX_COLUMNS = ["image", "image_sha256", "model", "weights", "result"]  # the publisher's, before every result's own


def test_cli_single_map_writes_checked_files(cli, vit, photo, workdir):
    result = cli("attend", photo, "--block", "4", "--head", "1", "--query", "74", "-o", "out", *RANDOM_CPU)
    assert result.exit_code == 0, result.stderr
    printed = " ".join(result.stdout.split())
    assert "block 4, head 1: attention of P74 (token 74, row 5, col 3)" in printed
    assert "sum over all 197 sources 1.000000" in printed and "RANDOM" in printed
    files = result_files(workdir / "out", "attention-b4-h1-q74")
    rows = read_csv(files["csv"])
    assert len(rows) == 197 and {row["result"] for row in rows} == {"attention-b4-h1-q74"}
    oracle = oracle_attention(vit, photo)[3, 0, 74]
    written = torch.tensor([float(row["attention"]) for row in rows])
    assert torch.allclose(written, oracle, rtol=0, atol=WEIGHT_TOLERANCE)
    assert [row["patch"] for row in rows[:3]] == ["CLS", "P1", "P2"]
    assert (rows[74]["row"], rows[74]["col"]) == ("5", "3")
    document = json.loads(files["json"].read_text())
    entry = document["result"]
    assert entry["query"] == {"token": 74, "name": "P74", "patch": 74, "row": 5, "col": 3}
    assert (entry["maps"][0]["block"], entry["maps"][0]["head"]) == (4, 1)
    assert entry["maps"][0]["cls_attention"] == pytest.approx(float(oracle[0]), abs=WEIGHT_TOLERANCE)
    assert document["experiment"]["settings"] == {
        "view": "map",
        "query": "P74",
        "query_token": 74,
        "scale": "own",
        "blocks": [4],
        "heads": [1],
        "top_k": 10,
    }
    assert document["subject"]["path"] == str(photo)
    assert document["provenance"]["weights"]["source"] == "random"
    assert files["png"].stat().st_size > 10_000


def test_cli_all_heads_share_one_csv(cli, photo, workdir):
    result = cli("attend", photo, "--block", "2", "--all-heads", "--query", "r0c0", "-f", "csv", *RANDOM_CPU)
    assert result.exit_code == 0, result.stderr
    rows = read_csv(result_files(workdir / "outputs", "attention-b2-hall-q1")["csv"])
    assert [int(row["head"]) for row in rows[::197]] == [1, 2, 3]
    assert {row["query"] for row in rows} == {"P1"}
    header = [*PREFIX_COLUMNS, "block", "head", "query", "query_token", "token", "patch", "row", "col", "attention"]
    assert result.stdout.splitlines()[0] == ",".join(header)
    assert len(result.stdout.splitlines()) == 1 + 3 * 197


def test_cli_all_blocks_json(cli, photo):
    result = cli("attend", photo, "--head", "3", "--view", "all-blocks", "--query", "cls", "-f", "json", *RANDOM_CPU)
    assert result.exit_code == 0, result.stderr
    (document,) = json.loads(result.stdout)["results"]
    assert document["experiment"]["name"] == "attention-ball-h3-qcls"
    entry = document["result"]
    assert [(item["block"], item["head"]) for item in entry["maps"]] == [(block, 3) for block in range(1, 13)]
    assert all(item["sum"] == pytest.approx(1.0, abs=1e-6) for item in entry["maps"])
    assert set(entry["self_check"]["max_abs_difference_by_block"]) == {str(block) for block in range(1, 13)}


def test_cli_summary_all_queries_csv(cli, photo, workdir):
    result = cli("attend", photo, "--view", "summary", "--query", "all", "-f", "csv", *RANDOM_CPU)
    assert result.exit_code == 0, result.stderr
    files = result_files(workdir / "outputs", "attention-summary-qall")
    assert "png" in files  # the table's measures as block x head heat maps
    rows = read_csv(files["csv"])
    assert len(rows) == 36 and {row["query"] for row in rows} == {"all"}
    assert list(rows[0]) == [
        *PREFIX_COLUMNS,
        "query",
        "block",
        "head",
        "cls_mass",
        "entropy_bits",
        "mean_distance_patches",
        "top_source",
        "top_token",
        "top_attention",
    ]
    assert result.stdout.count("\n") == 37


def test_cli_rollout(cli, vit, photo, workdir):
    result = cli(
        "attend", photo, "--view", "rollout", "--head-fusion", "min", "--discard-ratio", "0.2", "-o", "out", *RANDOM_CPU
    )
    assert result.exit_code == 0, result.stderr
    printed = " ".join(result.stdout.split())
    assert "attention ROLLOUT over 12 blocks, head fusion min" in printed
    assert "not a single head's attention" in printed
    files = result_files(workdir / "out", "rollout-fmin-d0.2-qcls")
    values = torch.tensor(json.loads(files["json"].read_text())["result"]["rollout"], dtype=torch.float64)
    expected = attention_rollout(oracle_attention(vit, photo), "min", 0.2)[0]
    assert torch.allclose(values, expected, atol=1e-6)
    assert len(read_csv(files["csv"])) == 197
    assert files["png"].is_file()


def test_cli_many_images_one_load(cli, photo, workdir, monkeypatch):
    import vitcli.loading

    loads = []
    real_load = vitcli.loading.load_model
    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args: loads.append(args) or real_load(*args))
    second = workdir / "second.jpg"
    second.write_bytes(photo.read_bytes())
    result = cli(
        "attend", photo, second, "--view", "summary", "--query", "cls", "-o", "runs", "-f", "json", *RANDOM_CPU
    )
    assert result.exit_code == 0, result.stderr
    assert len(loads) == 1
    documents = json.loads(result.stdout)["results"]
    assert [document["subject"]["path"] for document in documents] == [str(photo), str(second)]
    first_rows = read_csv(image_result(workdir / "runs", photo, "attention-summary-qcls", "csv"))
    second_rows = read_csv(image_result(workdir / "runs", second, "attention-summary-qcls", "csv"))
    assert len(first_rows) == 36
    assert {row["mean_distance_patches"] for row in first_rows} == {""}  # CLS has no place in the grid
    assert [row["cls_mass"] for row in first_rows] == [row["cls_mass"] for row in second_rows]


def test_cli_other_grid(cli, tiny384, photo, workdir):
    arguments = ["--model", TINY384, "--batch-size", "8", "--block", "1", "--head", "2", "--query", "r5c3"]
    result = cli("attend", photo, *arguments, *RANDOM_CPU)
    assert result.exit_code == 0, result.stderr
    rows = read_csv(result_files(workdir / "outputs", "attention-b1-h2-q124")["csv"])
    assert len(rows) == 1 + 24 * 24
    assert {row["query"] for row in rows} == {"P124"}
    assert (rows[-1]["patch"], rows[-1]["row"], rows[-1]["col"]) == ("P576", "23", "23")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--block", "0", "--head", "1"], "--block must be between 1 and 12"),
        (["--block", "13", "--head", "1"], "--block must be between 1 and 12"),
        (["--block", "1", "--head", "0"], "--head must be between 1 and 3"),
        (["--block", "1", "--head", "4"], "--head must be between 1 and 3"),
        (["--block", "1", "--head", "1", "--query", "0"], "patch 0 does not exist: patches are P1..P196"),
        (["--block", "1", "--head", "1", "--query", "197"], "patch 197 does not exist: patches are P1..P196"),
        (["--block", "1", "--head", "1", "--query", "-1"], "cannot read patch '-1'"),
        (["--block", "1", "--head", "1", "--query", "P300"], "patch P300 does not exist"),
        (["--block", "1", "--head", "1", "--query", "r14c0"], "outside the 14x14 grid"),
        (["--head", "1"], "choose a block: --block 1..12, or --view all-blocks"),
        (["--block", "1"], "choose a head: --head 1..3, or --all-heads"),
        (["--block", "1", "--head", "2", "--all-heads"], "--head 2 and --all-heads contradict each other"),
        (
            ["--view", "all-blocks", "--block", "2", "--head", "1"],
            "--view all-blocks covers every block: drop --block 2",
        ),
        (["--view", "summary", "--block", "3"], "--view summary covers every block and head: drop --block"),
        (["--view", "rollout", "--all-heads"], "--view rollout fuses the heads of every block: drop --all-heads"),
        (["--block", "1", "--head", "1", "--head-fusion", "max"], "only apply to --view rollout"),
        (["--view", "rollout", "--discard-ratio", "1"], "below 1"),
        (["--block", "1", "--head", "1", "--query", "all"], "--query all only works with --view summary"),
        (["--block", "1", "--head", "1", "--top-k", "0"], "--top-k must be between 1 and 197"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2_before_the_model_loads(cli, photo, arguments, message, monkeypatch):
    import vitcli.loading

    def no_model(*_arguments):
        raise AssertionError("the model was loaded before the usage check")

    monkeypatch.setattr(vitcli.loading, "load_model", no_model)
    result = cli("attend", photo, *arguments, *RANDOM_CPU)
    assert result.exit_code == 2
    assert message in result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert result.stdout == ""


def test_cli_unknown_view_is_a_usage_error(cli, photo):
    result = cli("attend", photo, "--view", "heat", *RANDOM_CPU)
    assert result.exit_code == 2
    assert "Invalid value for '--view'" in result.stderr and "'heat' is not one of map, summary" in result.stderr


def test_cli_refuses_a_model_whose_attention_cannot_be_captured(cli, photo, monkeypatch):
    """Before the model loads (capture.support): it was refused after loading, with exit 1, before issue 28."""
    import vitcli.loading

    name = "vit_small_patch16_18x2_224"  # parallel blocks: two attentions side by side in each block
    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    result = cli("attend", photo, "--model", name, "--block", "1", "--head", "1", *RANDOM_CPU)
    assert result.exit_code == 2
    assert f"`attend` needs what {name} (timm VisionTransformer) lacks: no attention probabilities" in result.stderr
    assert "(block 1 (ParallelThingsBlock) has no norm1" in result.stderr
    assert result.stdout == ""


def test_cli_refuses_to_print_when_the_self_check_fails(cli, vit, photo, monkeypatch, workdir):
    monkeypatch.setattr(vit, "attention_self_check", lambda block: torch.full((len(block.normed),), 0.5))
    result = cli("attend", photo, "--block", "1", "--head", "1", *RANDOM_CPU)
    assert result.exit_code == 1
    assert "self-check failed in block 1" in result.stderr and "tolerance 0.0001" in result.stderr
    assert result.stdout == "" and not list(workdir.rglob("attention-*"))
