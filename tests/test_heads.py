"""`vitcli heads` (TextSpan over an image-text model's heads): the direct contributions' identity, the command's
files, its text-embedding cache and its refusals. The algorithm itself: test_textspan.py."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from conftest import RANDOM_CPU

open_clip = pytest.importorskip("open_clip")

from tiny_open_clip import TINY_CLIP, register  # noqa: E402

CLIP = ["--model", f"open_clip:{TINY_CLIP}"]
BANK = ["a dog", "a cat", "a red car", "the sea at night", "a bowl of [bold]soup[/bold]", "stripes"]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Six small images that differ (noise with a coloured block in a different place each)."""
    folder = tmp_path_factory.mktemp("heads-images")
    generator = np.random.default_rng(0)
    for number in range(6):
        pixels = generator.integers(0, 256, size=(64, 64, 3), dtype=np.uint8)
        pixels[8 * number : 8 * number + 24, 10:40] = generator.integers(0, 256, 3)
        Image.fromarray(pixels).save(folder / f"image{number}.png")
    return folder


@pytest.fixture
def bank(workdir):
    path = workdir / "bank.txt"
    path.write_text("\n".join(BANK) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def no_model_load(monkeypatch):
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ([*CLIP], "heads needs a text bank: --texts FILE"),
        ([*CLIP, "--texts", "blank.txt"], "--texts blank.txt holds no text: write one text per line"),
        ([*CLIP, "--texts", "missing.txt"], "--texts missing.txt: no such file"),
        ([*CLIP, "--texts", "bank.txt", "--k", "0"], "--k must be at least 1, not 0"),
        ([*CLIP, "--texts", "bank.txt", "--blocks", "0"], "--blocks must be at least 1, not 0"),
        ([*CLIP, "--texts", "bank.txt", "--blocks", "3"], f"--blocks 3: open_clip:{TINY_CLIP} has 2 blocks"),
        (["--texts", "bank.txt"], "`heads` needs what vit_tiny_patch16_224.augreg_in21k_ft_in1k (timm "),
        (["--texts", "bank.txt"], "lacks: no text tower (open_clip models (--model open_clip:NAME"),
    ],
)
def test_usage_errors_exit_2_before_the_model_loads(cli, images, bank, no_model_load, options, message):
    register()
    (bank.parent / "blank.txt").write_text("\n  \n\n", encoding="utf-8")
    result = cli("heads", images, *options, *RANDOM_CPU)
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_one_image_is_refused_before_loading(cli, images, bank, no_model_load):
    register()
    result = cli("heads", images / "image0.png", *CLIP, "--texts", bank, *RANDOM_CPU)
    assert result.exit_code == 2
    assert "heads describes what varies over the images: give at least 2 (dozens or more), not 1" in result.stderr
