"""The explorer's script lives in vitcli/presentation/explorer.js (package data, linted by `make lint-js`): the page
inlines exactly that file's text, its Content-Security-Policy allows it by the SHA-256 of that text, and an installed
wheel carries the file. The browser tests (tests/test_explore_browser.py) run it in Chromium.

The oracle for the hash is hashlib over the file as it lies in the source tree, not the module's own `script_source`.
Failed before the fix: the script was a string in explore_page.py (no explorer.js); a wheel built without the
package-data entry in pyproject.toml had no explorer.js (test_an_installed_wheel_reads_the_script), and a dollar sign
in the script broke the page's string.Template (test_a_dollar_sign_in_the_script_reaches_the_page).
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "vitcli" / "presentation" / "explorer.js"
DATA = {"title": "t", "crop": "data:,", "header": "{}", "attention": "", "rollout": ""}


def inline_script_and_policy(page: str) -> tuple[str, str]:
    """The page's one executable <script> (the others are typed data) and its policy, read without the module."""
    scripts = re.findall(r"<script>(.*?)</script>", page, flags=re.DOTALL)
    assert len(scripts) == 1
    policy = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">', page)
    assert policy is not None
    return scripts[0], html.unescape(policy.group(1))


def sha256_source(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


def test_the_page_inlines_explorer_js_and_allows_exactly_it_by_its_hash():
    from vitcli.presentation.explore_page import PAGE
    from vitcli.report.markup import POLICY as REPORT_POLICY

    script, policy = inline_script_and_policy(PAGE.substitute(DATA))
    assert script == "\n" + SOURCE.read_text(encoding="utf-8")
    assert f"script-src {sha256_source(script)};" in policy
    assert sha256_source(script) in REPORT_POLICY  # the report's page embeds the explorer in a srcdoc frame


def test_a_dollar_sign_in_the_script_reaches_the_page():
    from vitcli.presentation.explore_page import page

    script = "\nconst price = `${1 + 1} $ $$`;\n"
    inlined, policy = inline_script_and_policy(page(script).substitute(DATA))
    assert inlined == script and f"script-src {sha256_source(script)};" in policy


@pytest.mark.slow
def test_an_installed_wheel_reads_the_script(tmp_path):
    """Build a wheel from a copy of the source (no build files left in the checkout), install it into a folder, and
    read the script there through importlib.resources, as an installed vitcli does."""
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(REPO / "vitcli", source / "vitcli", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "--quiet"]
    wheels, installed = tmp_path / "wheels", tmp_path / "installed"
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(wheels), str(source)]
    subprocess.run(build, check=True, timeout=300)
    subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(installed), *map(str, wheels.glob("*.whl"))], check=True
    )
    read = (
        "import importlib.resources as r, vitcli.presentation as p; print(p.__file__); "
        "print(r.files('vitcli.presentation').joinpath('explorer.js').read_text(), end='')"
    )
    shown = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(installed)!r}); {read}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    where, text = shown.stdout.split("\n", 1)
    assert Path(where).is_relative_to(installed)  # not the checkout nor an editable install
    assert text == SOURCE.read_text(encoding="utf-8")
