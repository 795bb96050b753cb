"""Shared fixtures: seeded random-weight timm ViTs (no network), sample images, and a CLI runner.

The `vit` fixture is the same object the CLI builds for `--weights random --seed 0 --device cpu`, because the
model wrapper loads once per process: CLI tests that pass RANDOM_CPU reuse it instead of rebuilding it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

if TYPE_CHECKING:
    from vitcli.model import VitModel

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The report tests' fixtures (report_of, browser), registered here so that its assertions are rewritten too.
pytest_plugins = ["report_pages"]

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "images"
RANDOM_CPU = ["--weights", "random", "--seed", "0", "--device", "cpu"]


@pytest.fixture(scope="session")
def vit():
    """The default architecture (ViT-Tiny, patch 16, 224) with seeded random weights."""
    from vitcli.loading import load_model
    from vitcli.spec import WeightsSpec

    return load_model(WeightsSpec(random=True, seed=0), "cpu")


@pytest.fixture(scope="session")
def photo(tmp_path_factory) -> Path:
    """A 320x240 RGB JPEG with structure (gradients and shapes) so patches differ from each other."""
    height, width = 240, 320
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 255 / width, y * 255 / height, ((x // 40 + y // 40) % 2) * 200], axis=-1)
    path = tmp_path_factory.mktemp("images") / "synthetic.jpg"
    Image.fromarray(rgb.astype(np.uint8)).save(path, quality=95)
    return path


@pytest.fixture(scope="session")
def newfoundland() -> Path:
    """The lecture's dog photo, shipped in examples/images."""
    return EXAMPLES / "newfoundland_31.jpg"


@pytest.fixture(scope="session")
def persian() -> Path:
    """The lecture's cat photo, shipped in examples/images."""
    return EXAMPLES / "Persian_98.jpg"


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """Run in an empty folder so the default outputs/ lands there, not in the repository."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def cli(workdir):
    """invoke(*args) runs `vitcli ARGS` in-process; result.stdout and result.stderr are separate."""
    from vitcli.cli import app

    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, [str(arg) for arg in args], catch_exceptions=False)

    return invoke


def result_files(root: Path, name: str) -> dict[str, Path]:
    """The files of result `name` under an output folder (ROOT/MODEL/SUBJECT/NAME.*), keyed by suffix ('json',
    'csv', 'png', 'grid.csv'...); exactly one subject folder must hold them."""
    found = sorted(root.glob(f"*/*/{name}.*"))
    folders = {path.parent for path in found}
    assert len(folders) == 1, f"expected {name}.* in one folder under {root}, found {found}"
    return {path.name[len(name) + 1 :]: path for path in found}


def small_vit(name: str, seed: int = 0, **kwargs) -> VitModel:
    """A real timm architecture, cut down (fewer blocks, smaller input) and seeded, wrapped as the CLI wraps it."""
    import timm
    import torch

    from vitcli.model import VitModel
    from vitcli.spec import WeightsSpec

    torch.manual_seed(seed)
    net = timm.create_model(name, pretrained=False, **kwargs)
    return VitModel(net, WeightsSpec(model_name=name, random=True, seed=seed), torch.device("cpu"), 8)


@pytest.fixture(scope="module")
def tiny2() -> VitModel:
    """ViT-Tiny with 2 blocks on a 64x64 input: a 4x4 grid of 16 patches + CLS, quick enough for one patch per step;
    one per test module."""
    return small_vit("vit_tiny_patch16_224.augreg_in21k_ft_in1k", depth=2, img_size=64)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread: other processes share the cores, and nothing compared here depends on the thread count."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
