"""`vitcli patches`: the grid's numbering and the patch projection, checked against the model's own Conv2d."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import RANDOM_CPU, result_files


def read_csv(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_patches_numbering_projection_check_and_files(cli, vit, newfoundland, workdir):
    result = cli("patches", newfoundland, *RANDOM_CPU, "--patch", "63", "-o", "out")
    assert result.exit_code == 0, result.stderr
    assert "P63 = token 63: row 4, col 6 zero-based (row 5, col 7 from one)" in result.stdout
    assert "max |X W_E + b_E - Conv2d|" in result.stdout
    files = result_files(workdir / "out", "patches-p63-v8")
    assert set(files) == {"json", "csv", "png"}
    rows = read_csv(files["csv"].read_text())
    assert len(rows) == 196
    p63 = rows[62]
    assert (p63["patch"], p63["token"], p63["row"], p63["col"]) == ("P63", "63", "4", "6")
    assert (p63["left"], p63["top"], p63["right"], p63["bottom"]) == ("96", "64", "112", "80")
    assert (p63["image"], p63["result"]) == (str(newfoundland), "patches-p63-v8")
    document = json.loads(files["json"].read_text())
    assert document["experiment"]["settings"] == {"patch": ["P63"], "values": 8}
    grid = document["result"]["grid"]
    assert (grid["grid_rows"], grid["grid_cols"], grid["patches"], grid["rows_with_prefix"]) == (14, 14, 196, 197)
    assert grid["projection_max_abs_difference_vs_conv2d"] < 1e-5
    (detail,) = document["result"]["selected"]
    lengths = [len(detail[key]) for key in ("pixels", "projection", "position_embedding", "block1_input")]
    assert lengths == [768, 192, 192, 192]
    # Independent oracle: the Conv2d's output for P63 plus the position embedding of token 63.
    image = vit.prepare(newfoundland).input.unsqueeze(0)
    with torch.inference_mode():
        conv = vit.net.patch_embed.proj(image).flatten(2)[0, :, 62]
        position = vit.net.pos_embed[0, 63].detach()
    assert np.allclose(detail["projection"], conv.numpy(), atol=1e-5)
    assert np.allclose(detail["block1_input"], (conv + position).numpy(), atol=1e-5)
    assert float(p63["proj_0"]) == pytest.approx(float(conv[0]), abs=1e-5)
    with Image.open(files["png"]) as png:
        assert png.size[0] > 500


def test_patches_accepts_a_grid_position_and_csv_on_stdout(cli, photo):
    result = cli("patches", photo, *RANDOM_CPU, "--patch", "r4c6", "--format", "csv", "--values", "3")
    rows = read_csv(result.stdout)
    assert len(rows) == 196 and "proj_2" in rows[0] and "proj_3" not in rows[0]
    assert {row["result"] for row in rows} == {"patches-p63-v3"}
    json_result = cli("patches", photo, *RANDOM_CPU, "--patch", "r4c6", "--format", "json", "-q")
    assert json.loads(json_result.stdout)["results"][0]["result"]["selected"][0]["patch"] == "P63"


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ("P300", "patch P300 does not exist: patches are P1..P196 or r0c0..r13c13"),
        ("0", "patch 0 does not exist"),
        ("r14c0", "grid position r14c0 is outside the 14x14 grid"),
        ("x7", "cannot read patch 'x7'"),
    ],
)
def test_patches_rejects_patches_outside_the_grid(cli, photo, patch, message):
    result = cli("patches", photo, *RANDOM_CPU, "--patch", patch)
    assert result.exit_code == 2
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
