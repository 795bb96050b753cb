"""File names that are not UTF-8 (Latin-1 file systems, archives): read, written escaped everywhere, runs go on.

Python gives such a name as text with surrogates (`caf\\udce9.jpg`), which UTF-8 cannot encode: before the fix
every command on such a file ended in an internal error, and one such name in a folder ended a whole `vitcli run`.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vitcli.filenames import escaped_path, path_from_escaped

from configs import write_config
from conftest import RANDOM_CPU

VITCLI = shutil.which("vitcli", path=str(Path(sys.executable).parent)) or "vitcli"
LATIN1 = b"caf\xe9.jpg"  # "café.jpg" as Latin-1 writes it: not UTF-8
SHOWN = "caf\\xe9.jpg"  # as vitcli writes it: the byte escaped


def latin1_copy(folder: Path, photo: Path, name: bytes = LATIN1) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    target = os.path.join(os.fsencode(folder), name)
    shutil.copyfile(photo, target)
    return Path(os.fsdecode(target))


# ----- the escaping


def test_escaping_undoes_exactly_and_always_encodes_for_random_byte_names():
    rng = np.random.default_rng(0)
    alphabet = [byte for byte in range(1, 256) if byte != ord("/")]
    names = {bytes(rng.choice(alphabet, size=rng.integers(1, 12))) for _ in range(3000)}
    names |= {b"\\", b"\\\\", b"\\x", b"\\xe9", b"\xe9", b"\\\xe9", b"caf\xc3\xa9", b"\xc3", b"\xed\xb3\xa9"}
    shown = {}
    for name in names:
        text = escaped_path(os.fsdecode(name))
        text.encode("utf-8")  # never raises
        assert os.fsencode(path_from_escaped(text)) == name
        shown[text] = name
    assert len(shown) == len(names)  # no two names are written alike


def test_utf8_names_without_backslashes_are_written_as_they_are():
    assert escaped_path(Path("/photos/Zoë/café 1.jpg")) == "/photos/Zoë/café 1.jpg"
    assert escaped_path(os.fsdecode(b"/photos/caf\xe9.jpg")) == "/photos/caf\\xe9.jpg"
    assert escaped_path("a\\xe9.jpg") == "a\\\\xe9.jpg"  # a real backslash cannot pass for an escape


# ----- the commands


def test_predict_reads_a_latin1_named_file_and_names_it_escaped_everywhere(cli, photo, workdir):
    image = latin1_copy(workdir / "images", photo)
    result = cli("predict", image, *RANDOM_CPU, "-k", "2", "-f", "json")
    assert result.exit_code == 0, result.stderr
    (document,) = json.loads(result.stdout)["results"]
    assert document["subject"]["path"] == escaped_path(image) and document["subject"]["path"].endswith(SHOWN)
    (folder,) = (workdir / "outputs").glob("*/caf_xe9-*")
    assert {path.suffix for path in folder.glob("predict-*")} == {".json", ".csv", ".png"}
    stored = json.loads(next(folder.glob("predict-*.json")).read_text(encoding="utf-8"))
    assert stored["subject"]["path"] == escaped_path(image)
    rows = list(csv.DictReader(io.StringIO(next(folder.glob("predict-*.csv")).read_text(encoding="utf-8"))))
    assert {row["image"] for row in rows} == {escaped_path(image)}
    table = cli("predict", image, *RANDOM_CPU, "-k", "2")
    assert table.exit_code == 0 and SHOWN in table.stdout, table.stderr


def test_predict_on_a_folder_with_a_latin1_name_does_every_image(cli, photo, workdir):
    image = latin1_copy(workdir / "images", photo)
    shutil.copyfile(photo, workdir / "images" / "plain.jpg")
    result = cli("predict", workdir / "images", *RANDOM_CPU, "-k", "1", "-f", "jsonl")
    assert result.exit_code == 0, result.stderr
    shown = [json.loads(line)["subject"]["path"] for line in result.stdout.splitlines()]
    assert sorted(shown) == sorted([escaped_path(image), str(workdir / "images" / "plain.jpg")])


@pytest.mark.slow
def test_the_installed_command_does_a_latin1_named_file(photo, tmp_path):
    image = latin1_copy(tmp_path / "images", photo)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [VITCLI, "predict", os.fsencode(image), *RANDOM_CPU, "-k", "1", "-o", os.fsencode(tmp_path / "out")]
    table = subprocess.run(command, capture_output=True, env=env, timeout=300)
    assert table.returncode == 0, table.stderr
    assert SHOWN.encode() in table.stdout and b"internal error" not in table.stderr
    document = json.loads(subprocess.run([*command, "-f", "json"], capture_output=True, env=env, timeout=300).stdout)
    # The recorded command line gives the shell the very bytes of the file name back.
    recorded = document["results"][0]["provenance"]["command"]
    word = next(word for word in recorded.split() if SHOWN in word)
    assert word.startswith("$'") and shutil.which("bash")
    assert subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True).stdout == os.fsencode(image)


CONFIG = """
name = "latin"
images = {images}
[model]
weights = "random"
seed = 0
device = "cpu"
[[experiments]]
command = "predict"
top-k = 2
"""


@pytest.mark.slow
def test_a_run_over_a_folder_with_a_latin1_name_does_every_image_resumes_and_reports(cli, photo, workdir):
    folder = workdir / "images"
    image = latin1_copy(folder, photo)
    shutil.copyfile(photo, folder / "plain.jpg")
    damaged = latin1_copy(folder, photo, b"ab\xeeme.jpg")
    damaged.write_bytes(b"not an image")
    config = write_config(workdir, [folder], CONFIG, "latin.toml")

    result = cli("run", config)
    assert result.exit_code == 1, result.stderr  # the damaged image failed; the others are done
    assert "2 of 3 images done, 1 failed" in result.stderr and "ab\\xeeme.jpg" in result.stderr
    root = workdir / "outputs" / "latin"
    manifest = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    assert {entry["image"] for entry in manifest["results"]} == {escaped_path(image), str(folder / "plain.jpg")}
    assert [failure["image"] for failure in manifest["failures"]] == [escaped_path(damaged)]
    assert escaped_path(image) in manifest["config"]["images"]
    assert manifest.get("not_in_this_run", []) == []  # the escaped names are this run's own images
    # What the record names reopens the very file: its bytes have the recorded hash.
    (entry,) = [entry for entry in manifest["results"] if "caf" in entry["image"]]
    from vitcli.hashing import file_sha256

    assert file_sha256(path_from_escaped(entry["image"])) == entry["image_sha256"]
    summary = (root / "summary.csv").read_text(encoding="utf-8")
    assert escaped_path(image) in summary

    again = cli("run", config)
    assert "skipped 2 results already complete" in again.stderr, again.stderr

    report = cli("report", root)
    assert report.exit_code == 0, report.stderr
    assert SHOWN in (root / "report.html").read_text(encoding="utf-8")
