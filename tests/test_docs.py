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


def test_the_family_table_in_docs_models_is_what_the_code_gives():
    """docs/models.md's family x command table is generated (`make docs`) from COMMAND_NEEDS and the adapters."""
    from vitcli.capture.family_table import page_with_table

    page = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    assert page == page_with_table(page), "docs/models.md's family table is stale: run 'make docs' and commit it"


def test_the_family_table_check_fails_on_a_stale_page(tmp_path):
    page = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    stale = tmp_path / "models.md"
    stale.write_text(page.replace("| `predict` | yes |", "| `predict` | no |", 1), encoding="utf-8")
    command = [sys.executable, "-m", "vitcli.capture.family_table", "--check", str(stale)]
    checked = subprocess.run(command, capture_output=True, text=True, check=False)
    assert checked.returncode == 1 and "stale" in checked.stderr
    fresh = tmp_path / "fresh.md"
    fresh.write_text(page, encoding="utf-8")
    assert subprocess.run([*command[:-1], str(fresh)], check=False).returncode == 0


def test_the_refusal_docs_models_shows_is_the_one_vitcli_gives():
    from vitcli.capture.support import support_refusal
    from vitcli.loading import describe
    from vitcli.spec import WeightsSpec

    siglip = describe(WeightsSpec(model_name="vit_base_patch16_siglip_224", random=True))
    page = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    assert f"error: {support_refusal('predict', siglip)}\n" in page
