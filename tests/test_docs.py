"""The README, the docs and the Makefile say what the code does: sizes, file listings and hints checked against it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import RANDOM_CPU

ROOT = Path(__file__).resolve().parents[1]
README_LIMIT = 14_000  # bytes: detail belongs in docs/


def test_the_readme_stays_short():
    size = len((ROOT / "README.md").read_bytes())
    assert size < README_LIMIT, f"README.md has {size} bytes: move detail to docs/"


def test_the_listing_in_docs_outputs_is_what_predict_and_patches_write(cli, newfoundland, workdir):
    text = (ROOT / "docs" / "outputs.md").read_text(encoding="utf-8")
    listing = text.split("Example, after `vitcli predict` and `vitcli patches --patch 63`")[1].split("```")[1]
    documented = set(listing.split()[1:])  # the words after the folder line
    for command in (["predict"], ["patches", "--patch", "63"]):
        assert cli(*command, newfoundland, *RANDOM_CPU, "--quiet").exit_code == 0
    (folder,) = (workdir / "outputs").glob("*/*/")
    assert documented == {path.name for path in folder.iterdir() if not path.name.startswith(".")}  # not the lock


def make_demo(tmp_path: Path) -> subprocess.CompletedProcess:
    """`make demo` with this interpreter's vitcli, offline and with an empty Hugging Face cache."""
    stamp = tmp_path / "installed"
    stamp.touch()  # newer than pyproject.toml: make installs nothing
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    return subprocess.run(
        ["make", "-s", "demo", f"BIN={Path(sys.executable).parent}", f"STAMP={stamp}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )


@pytest.mark.slow  # several seconds: `make test` leaves it to CI's full run
def test_make_demo_offline_points_to_demo_offline(tmp_path):
    result = make_demo(tmp_path)
    assert result.returncode != 0
    assert "error: no weights for vit_tiny_patch16_224" in result.stderr
    assert re.search(r"offline\?\): 'make demo-offline' runs the same with random weights", result.stderr)
    assert RANDOM_CPU[0] not in result.stdout
