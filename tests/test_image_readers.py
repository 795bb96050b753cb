"""Every command that reads a person's image refuses a decompression bomb in the one line `load_rgb` gives, whatever
role the image plays (an image of the run, compare's images, patch's CORRUPT, probe's training images, explain's
masks in test_localisation.py, ablate's reference in test_ablate.py)."""

from __future__ import annotations

import shutil

import pytest
from test_bad_input import png_header_only

from conftest import RANDOM_CPU

BOMB_MESSAGE = "is too large to decode safely"


@pytest.mark.parametrize(
    "command",
    [["predict", "BOMB"], ["compare", "PHOTO", "BOMB"], ["patch", "PHOTO", "BOMB"], ["probe", "FOLDERS"]],
    ids=["predict", "compare", "patch-corrupt", "probe"],
)
def test_a_bomb_is_refused_in_the_same_line_by_every_reader(cli, photo, workdir, command):
    bomb = png_header_only(workdir / "bomb.png", 100_000, 100_000)
    folders = workdir / "classes"
    for name in ("cat", "dog"):
        (folders / name).mkdir(parents=True)
        shutil.copy(photo, folders / name / "a.jpg")
        shutil.copy(photo, folders / name / "b.jpg")
    shutil.copy(bomb, folders / "dog" / "c.png")
    bombed = folders / "dog" / "c.png"
    arguments = [{"BOMB": bomb, "PHOTO": photo, "FOLDERS": folders}.get(item, item) for item in command]
    result = cli(*arguments, *RANDOM_CPU, "-q")
    assert result.exit_code == 1, result.stderr
    expected = bombed if command[0] == "probe" else bomb
    assert f"{expected} {BOMB_MESSAGE}" in result.stderr, result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
