"""vitcli explore without a browser: the page's stored numbers against timm's own attention, its size and
self-containment, the size bound (refused before the model loads), and the same job under `vitcli run`.

The oracle for the numbers is timm's unfused attention (tests/test_attend.py's `oracle_attention`), which shares
nothing with `VitModel.trace`. Broken on purpose once: storing each matrix transposed (sources x queries) failed
test_page_stores_timms_attention_as_float16.
"""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest
import torch
from test_attend import oracle_attention

from vitcli.errors import UsageError
from vitcli.experiments.explore import PAGE_VALUE_BOUND, check_page_bound, page_values, parse_blocks
from vitcli.experiments.rollout import attention_rollout
from vitcli.grid import PatchGrid

from conftest import RANDOM_CPU, result_files

PAGE_LIMIT = 8_000_000  # bytes: the goal for ViT-Tiny
SMALL = "vit_small_patch16_224"  # 12 blocks x 6 heads: above the bound without --blocks


def stored(page: str, element: str) -> np.ndarray:
    """A base64 float16 block of the page, decoded independently of its script."""
    match = re.search(rf'<script type="text/plain" id="{element}">([^<]*)</script>', page)
    assert match is not None, element
    return np.frombuffer(base64.b64decode(match.group(1)), dtype="<f2").astype(np.float64)


@pytest.fixture(scope="module")
def explored(tmp_path_factory, newfoundland):
    from typer.testing import CliRunner

    from vitcli.cli import app

    out = tmp_path_factory.mktemp("explore")
    result = CliRunner().invoke(app, ["explore", str(newfoundland), *RANDOM_CPU, "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    return result_files(out, "explore"), result


def test_page_stores_timms_attention_as_float16(explored, vit, newfoundland):
    files, _ = explored
    page = files["html"].read_text(encoding="utf-8")
    exact = oracle_attention(vit, newfoundland).double().numpy()  # (blocks, heads, N, N)
    attention = stored(page, "explorer-attention").reshape(exact.shape)
    bound = np.maximum(2.0**-11 * np.abs(exact), 2.0**-25) + 1e-7  # float16 rounding + fused vs explicit float32
    assert np.all(np.abs(attention - exact) <= bound)
    rollout = stored(page, "explorer-rollout").reshape(exact.shape[-2:])
    expected = attention_rollout(torch.from_numpy(exact)).numpy()
    assert np.all(np.abs(rollout - expected) <= np.maximum(2.0**-11 * np.abs(expected), 2.0**-25) + 1e-6)
    document = json.loads(files["json"].read_text())
    measured = document["result"]["stored"]["largest_error"]["attention"]
    assert 0 < measured <= 2.0**-11 * exact.max()
    assert document["result"]["page_bytes"] == files["html"].stat().st_size


def test_page_is_self_contained_and_under_8_mb(explored):
    files, _ = explored
    page = files["html"].read_text(encoding="utf-8")
    size = files["html"].stat().st_size
    print(f"\nexplorer page for ViT-Tiny: {size / 1e6:.2f} MB")
    assert size < PAGE_LIMIT
    # Nothing fetched: no URL but data: ones in any src or href, no import, no fetch.
    assert re.findall(r'(?:src|href)="(?!data:)[^"]*"', page) == []
    assert "http://" not in page and "https://" not in page
    for call in ("fetch(", "XMLHttpRequest", "import("):
        assert call not in page


def test_csv_and_json_describe_every_block_and_head(explored, vit, newfoundland):
    files, result = explored
    exact = oracle_attention(vit, newfoundland).double()
    document = json.loads(files["json"].read_text())
    assert document["experiment"] == {
        "command": "explore",
        "name": "explore",
        "settings": {"blocks": list(range(1, 13)), "explain": None},
    }
    rows = document["result"]["by_block_and_head"]
    assert [(row["block"], row["head"]) for row in rows] == [(b, h) for b in range(1, 13) for h in range(1, 4)]
    for row in rows:
        matrix = exact[row["block"] - 1, row["head"] - 1]
        assert row["mean_cls_attention"] == pytest.approx(float(matrix[:, 0].mean()), abs=1e-7)
        assert row["mean_self_attention"] == pytest.approx(float(matrix.diagonal().mean()), abs=1e-7)
    assert files["csv"].read_text().count("\n") == 1 + 36
    assert "explore.html" in result.stderr


def test_blocks_parse_and_name_the_files(cli, photo, workdir):
    assert parse_blocks("4", 12) == [4]
    assert parse_blocks("1-3,12, 2", 12) == [1, 2, 3, 12]
    assert parse_blocks(None, 3) == parse_blocks("all", 3) == [1, 2, 3]
    result = cli("explore", photo, "--blocks", "1-2,12", *RANDOM_CPU)
    assert result.exit_code == 0, result.stderr
    files = result_files(workdir / "outputs", "explore-b1-2_12")
    assert set(files) == {"json", "csv", "html"}
    assert json.loads(files["json"].read_text())["result"]["blocks"] == [1, 2, 12]


def test_the_bound_is_stated_and_holds_for_vit_tiny():
    grid = PatchGrid(224, 224, 16, ("CLS",))
    assert page_values(12, 3, 197) == (12 * 3 + 1) * 197 * 197 == 1_435_933
    check_page_bound("tiny", 12, 3, grid, list(range(1, 13)), False)  # fits
    with pytest.raises(UsageError, match="pass --blocks with at most 8 blocks"):
        check_page_bound(SMALL, 12, 6, grid, list(range(1, 13)), False)
    assert page_values(8, 6, 197) <= PAGE_VALUE_BOUND < page_values(9, 6, 197)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--model", SMALL], f"explore: {SMALL} has 12 blocks x 6 heads x 197x197 attention"),
        (["--model", SMALL], "pass --blocks with at most 8 blocks, e.g. --blocks 1-8 or --blocks 12"),
        (["--model", SMALL, "--blocks", "1-9"], "explore: --blocks 1, 2, 3, 4, 5, 6, 7, 8, 9 has 9 blocks"),
        (["--model", "vit_base_patch8_224"], "one block of vit_base_patch8_224 alone holds"),
        (["--blocks", "0"], "--blocks 0: blocks run from 1 to 12"),
        (["--blocks", "4-2"], "--blocks 4-2: blocks run from 1 to 12"),
        (["--blocks", "x"], "--blocks x: write blocks as 4, 1-4, 1,6,12 or all"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_the_model_loads(cli, photo, arguments, message, monkeypatch):
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    result = cli("explore", photo, *RANDOM_CPU, *arguments)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr
    assert result.stdout == ""


def test_vitcli_run_config_writes_the_page(cli, photo, workdir):
    config = workdir / "explore.toml"
    config.write_text(
        f'name = "pages"\nimages = ["{photo}"]\n\n[[experiments]]\ncommand = "explore"\nblocks = "3"\n',
        encoding="utf-8",
    )
    result = cli("run", config, *RANDOM_CPU, "--quiet")
    assert result.exit_code == 0, result.stderr
    (page,) = (workdir / "outputs" / "pages").glob("*/*/explore-b3.html")
    values = stored(page.read_text(encoding="utf-8"), "explorer-attention")
    assert values.size == 3 * 197 * 197


def test_explain_maps_on_the_page_are_explains_own(cli, photo, workdir):
    """--explain runs `vitcli explain`'s own job with its defaults: the page carries exactly its maps. Broken on
    purpose once: storing each map transposed failed this test."""
    result = cli("explore", photo, "--blocks", "1", "--explain", *RANDOM_CPU, "--quiet")
    assert result.exit_code == 0, result.stderr
    page = result_files(workdir / "outputs", "explore-b1-explain")["html"].read_text(encoding="utf-8")
    header = json.loads(re.search(r'id="explorer-header">([^<]*)</script>', page).group(1))
    explained = cli("explain", photo, *RANDOM_CPU, "--format", "json", "--quiet")
    assert explained.exit_code == 0, explained.stderr
    maps = json.loads(explained.stdout)["results"][0]["result"]["maps"]
    assert [item["method"] for item in header["maps"]] == [item["method"] for item in maps]
    for shown, expected in zip(header["maps"], maps, strict=True):
        assert shown["values"] == [value for line in expected["values"] for value in line]
        assert shown["unit"] == expected["unit"]


def test_the_page_script_has_no_html_sink_and_its_json_cannot_close_its_script():
    """A cheap guard beside tests/test_hostile_pages.py (which runs hostile labels in Chromium): the page's script
    builds elements with createElement and puts every text in with textContent, never through a sink that parses
    markup; the JSON header carries any text without ending its <script> element. Failed before the fix: the caption
    was set with innerHTML."""
    from vitcli.presentation.explore import _script_json
    from vitcli.presentation.explore_page import SCRIPT

    sinks = (
        r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|srcdoc|\beval\(|new Function|createContextualFragment"
    )
    assert re.findall(sinks, SCRIPT) == []
    hostile = {"image": "</script><script>window.__pwned=1</script><!-- \u2028\u2029 & '\"", "prefix": ["<b>"]}
    encoded = _script_json(hostile)
    assert not set(encoded) & set("<>&\u2028\u2029") and json.loads(encoded) == hostile
