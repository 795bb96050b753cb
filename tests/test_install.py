"""A torch and torchvision that do not match (torchvision built for another torch, e.g. a CPU-only torch beside
PyPI's torchvision) fail inside timm's import: vitcli names both versions in one line instead of an internal error."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

VITCLI = shutil.which("vitcli", path=str(Path(sys.executable).parent)) or "vitcli"


def test_a_mismatched_torchvision_is_named_in_one_line(photo, tmp_path):
    """Simulated: a torchvision that raises on import what a mismatched one raises. Before the fix: exit 1 with
    "internal error (RuntimeError): operator torchvision::nms does not exist"."""
    fake = tmp_path / "fake" / "torchvision"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    path = os.pathsep.join(filter(None, [str(fake.parent), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [VITCLI, "predict", str(photo), "--weights", "random", "--device", "cpu", "-o", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1 and "internal error" not in done.stderr, done.stderr
    expected = f"torch {version('torch')} and torchvision {version('torchvision')} do not match"
    assert expected in done.stderr and "(operator torchvision::nms does not exist)" in done.stderr
    assert "pip install torch==" in done.stderr
