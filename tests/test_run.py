"""`vitcli run` and `vitcli merge`: configs, manifests, summaries, resume, shards, and refused configs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas
import pytest
from PIL import Image

from configs import write_config
from conftest import RANDOM_CPU, result_files

VITCLI = shutil.which("vitcli", path=str(Path(sys.executable).parent)) or "vitcli"

CONFIG = """
name = "pair"
images = {images}
[model]
weights = "random"
seed = 0
device = "cpu"
[[experiments]]
command = "predict"
top-k = 3
[[experiments]]
command = "patches"
patch = ["63"]
values = 4
"""


def disk_files(root: Path) -> set[str]:
    """Result files under a run folder, as manifest-relative paths (indexes, locks, records and the run's own files
    aside)."""
    return {
        str(path.relative_to(root))
        for path in root.rglob("*")
        if path.is_file()
        and path.parent not in (root, root / "records")
        and path.name not in ("index.json", ".index.lock")
    }


def test_a_config_run_writes_every_declared_file_and_its_summary_equals_the_single_commands(
    cli, photo, newfoundland, workdir
):
    config = write_config(workdir, [photo, newfoundland], CONFIG)
    result = cli("run", config)
    assert result.exit_code == 0, result.stderr
    root = workdir / "outputs" / "pair"
    manifest = json.loads((root / "manifest.json").read_text())
    assert {(Path(entry["image"]).name, entry["experiment"]) for entry in manifest["results"]} == {
        (name, experiment)
        for name in ("synthetic.jpg", "newfoundland_31.jpg")
        for experiment in ("predict-k3", "patches-p63-v4")
    }
    listed = {file for entry in manifest["results"] for file in entry["files"]}
    assert listed == disk_files(root)
    assert all(name.endswith((".json", ".csv", ".png")) for name in listed)
    assert manifest["failures"] == [] and manifest["provenance"]["weights"]["source"] == "random"
    assert set(manifest["timings"]) == {"predict-k3", "patches-p63-v4"}

    summary = pandas.read_csv(root / "summary.csv")
    assert list(summary["image"]) == sorted([str(photo), str(newfoundland)])
    for image in (photo, newfoundland):
        single = json.loads(cli("predict", image, *RANDOM_CPU, "--top-k", "3", "-f", "json", "-o", "single").stdout)
        best = single["results"][0]["result"]["top"][0]
        row = summary[summary["image"] == str(image)].iloc[0]
        assert row["predict_top1_class"] == best["class_index"]
        # The run batches both images in one forward, the single command runs one: float32 sums differ in order.
        assert row["predict_top1_probability"] == pytest.approx(best["probability"], rel=1e-5)


def test_command_line_options_override_the_config_and_images_replace_its_images(cli, photo, newfoundland, workdir):
    config = write_config(workdir, [newfoundland], CONFIG)
    result = cli("run", config, photo, "--seed", "3", "-o", "elsewhere", "-f", "json")
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((workdir / "elsewhere" / "pair" / "manifest.json").read_text())
    assert [Path(entry["image"]).name for entry in manifest["results"]] == ["synthetic.jpg"] * 2
    assert manifest["provenance"]["weights"]["seed"] == 3
    assert manifest["config"]["model"]["seed"] == 3
    document = json.loads(result.stdout)
    assert {entry["experiment"]["name"] for entry in document["results"]} == {"predict-k3", "patches-p63-v4"}


def test_a_second_run_skips_finished_results_and_force_redoes_them(cli, photo, workdir):
    config = write_config(workdir, [photo], CONFIG)
    assert cli("run", config).exit_code == 0
    json_file = result_files(workdir / "outputs" / "pair", "predict-k3")["json"]
    first = json_file.stat().st_mtime_ns
    again = cli("run", config, "-f", "jsonl")
    assert again.exit_code == 0 and again.stdout == ""
    assert "skipped 2 results already complete" in again.stderr
    assert json_file.stat().st_mtime_ns == first
    # A result whose file was damaged is not complete: only it is redone.
    json_file.write_text("{}")
    redo = cli("run", config, "-f", "jsonl")
    assert [json.loads(line)["experiment"]["name"] for line in redo.stdout.splitlines()] == ["predict-k3"]
    forced = cli("run", config, "--force", "-f", "jsonl")
    assert len(forced.stdout.splitlines()) == 2


def test_a_bad_image_is_reported_in_the_manifest_and_the_run_goes_on(cli, photo, workdir):
    broken = workdir / "broken.jpg"
    broken.write_bytes(b"not a jpeg at all")
    config = write_config(workdir, [photo, broken], CONFIG)
    result = cli("run", config)
    assert result.exit_code == 1
    assert "1 of 2 images done, 1 failed" in result.stderr
    manifest = json.loads((workdir / "outputs" / "pair" / "manifest.json").read_text())
    (failure,) = manifest["failures"]
    assert failure["image"] == str(broken) and "not an image" in failure["error"]
    assert len(manifest["results"]) == 2


@pytest.mark.slow  # several seconds: `make test` leaves it to CI's full run
def test_shards_partition_the_images_and_merge_into_the_unsharded_summary(cli, photo, workdir):
    images = []
    for index in range(5):
        path = workdir / "pics" / f"im{index}.png"
        path.parent.mkdir(exist_ok=True)
        Image.open(photo).rotate(index * 30).save(path)
        images.append(path)
    config = write_config(workdir, images, CONFIG)
    assert cli("run", config, "-o", "whole").exit_code == 0
    shards = []
    for index in (1, 2, 3):
        assert cli("run", config, "--shard", f"{index}/3", "-o", "sharded").exit_code == 0
        shard = json.loads((workdir / "sharded" / "pair" / f"manifest-shard{index}of3.json").read_text())
        shards.append({entry["image"] for entry in shard["results"]})
    assert set.union(*shards) == {str(path) for path in images}
    assert sum(len(shard) for shard in shards) == len(images)
    merged = cli("merge", workdir / "sharded" / "pair")
    assert merged.exit_code == 0, merged.stderr
    whole = pandas.read_csv(workdir / "whole" / "pair" / "summary.csv")
    combined = pandas.read_csv(workdir / "sharded" / "pair" / "summary.csv")
    pandas.testing.assert_frame_equal(whole, combined)


@pytest.mark.parametrize("columns", [60, 100, 160])
def test_the_closing_table_shows_each_images_file_name_at_any_width(cli, photo, workdir, monkeypatch, columns):
    """Eight images (one row each) deep in one folder, two in a subfolder: each row shows what tells it apart."""
    folder = workdir / "data" / "experiments" / "2024-lab-session" / "photographs" / "batch-one"
    names = [f"img2{index:02d}_capture.jpg" for index in range(8)]
    for index, name in enumerate(names):
        (folder / ("second" if index >= 6 else "") / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(photo, folder / ("second" if index >= 6 else "") / name)
    images = sorted(folder.rglob("*.jpg"))
    monkeypatch.setenv("COLUMNS", str(columns))
    result = cli("run", write_config(workdir, images, CONFIG.split("[[experiments]]")[0] + PREDICT_ONLY))
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= columns
    rows = [line for line in lines if line.startswith("│")]
    image_column = "".join(row.split("│")[1].strip() for row in rows)
    for name in names:  # whole, folded onto more lines only on a narrow console
        assert image_column.count(name) == 1, result.stdout
        assert columns < 100 or sum(name in row for row in rows) == 1, result.stdout
    assert image_column.count("second") == 2
    assert str(folder) in "".join(result.stdout.split())  # the title names the common folder (folded if need be)


PREDICT_ONLY = """
[[experiments]]
command = "predict"
top-k = 3
"""


def test_merge_refuses_runs_of_different_configs(cli, photo, workdir):
    assert cli("run", write_config(workdir, [photo], CONFIG), "-o", "a").exit_code == 0
    other = CONFIG.replace("top-k = 3", "top-k = 4")
    assert cli("run", write_config(workdir, [photo], other), "-o", "b").exit_code == 0
    result = cli("merge", workdir / "a" / "pair", workdir / "b" / "pair", "--into", workdir / "c")
    assert result.exit_code == 2
    assert "different configs or models" in result.stderr and result.stderr.count("\n") == 1


BAD_CONFIGS = [
    ("unknown key", "colour = 'red'\n", "colour: unknown key"),
    (
        "unknown experiment",
        "[[experiments]]\ncommand = 'dance'\n",
        "experiments[0].command: 'dance' is not an experiment",
    ),
    (
        "unknown option",
        "[[experiments]]\ncommand = 'predict'\nbogus = 1\n",
        "experiments[0].bogus: `predict` has no such option",
    ),
    ("wrong type", "[[experiments]]\ncommand = 'predict'\ntop-k = 'many'\n", "experiments[0].top-k: Invalid value"),
    (
        "float for an integer",
        "[[experiments]]\ncommand = 'predict'\ntop-k = 2.5\n",
        "experiments[0].top-k: 2.5 is not an integer",
    ),
    (
        "out of range",
        "[[experiments]]\ncommand = 'predict'\ntop-k = 1001\n",
        "experiments[0].top-k: --top-k must be between 1 and 1000",
    ),
    (
        "patch outside the grid",
        "[[experiments]]\ncommand = 'patches'\npatch = ['P300']\n",
        "experiments[0]: patch P300 does not exist",
    ),
    ("model key", "[model]\ncolour = 1\n[[experiments]]\ncommand = 'predict'\n", "model.colour: unknown key"),
    (
        "model value",
        "[model]\nweights = 'borrowed'\n[[experiments]]\ncommand = 'predict'\n",
        "model.weights: Invalid value",
    ),
    (
        "shared option in an experiment",
        "[[experiments]]\ncommand = 'predict'\ndevice = 'cpu'\n",
        "experiments[0].device: model and output options belong in [model]",
    ),
    (
        "misspelt choice",
        "[[experiments]]\ncommand = 'attend'\nview = 'maps'\n",
        "experiments[0].view: Invalid value for '--view': 'maps' is not one of map, summary, rollout, all-blocks "
        "(did you mean map?)",
    ),
    ("no experiments", "name = 'x'\n", "experiments: the config declares no [[experiments]]"),
    ("not TOML", "name = \n", "is not valid TOML"),
]


@pytest.mark.parametrize(("case", "text", "message"), BAD_CONFIGS, ids=[case[0] for case in BAD_CONFIGS])
def test_bad_configs_are_refused_with_their_key_path_before_the_model_loads(
    cli, photo, workdir, monkeypatch, case, text, message
):
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args: pytest.fail("the model was loaded"))
    path = workdir / "bad.toml"
    path.write_text(text)
    result = cli("run", path, photo, *RANDOM_CPU)
    assert result.exit_code == 2, (case, result.stderr)
    assert message in result.stderr, (case, result.stderr)
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_run_killed_by_sigterm_resumes_without_redoing_or_duplicating(photo, tmp_path):
    images = []
    for index in range(24):
        path = tmp_path / "pics" / f"im{index:02d}.png"
        path.parent.mkdir(exist_ok=True)
        Image.open(photo).rotate(index * 15).save(path)
        images.append(path)
    config = write_config(tmp_path, images, CONFIG)
    command = [VITCLI, "run", str(config), "--batch-size", "2", "-f", "jsonl"]
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first_results = [process.stdout.readline() for _ in range(6)]  # streamed: read while the run goes on
    assert process.poll() is None and all(line.startswith("{") for line in first_results)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143 and "terminated" in stderr
    root = tmp_path / "outputs" / "pair"
    assert not list(root.rglob("*.tmp"))
    before = json.loads((root / "manifest.json").read_text())
    done_before = {(entry["image"], entry["experiment"]) for entry in before["results"]}
    assert 6 <= len(done_before) < 48
    # A folder's index.json is rewritten whenever a result lands in it (the kill may fall between an image's two
    # experiments); what it said of the results finished before must not change.
    results = [path for path in root.rglob("*.json") if path.parent != root and path.name != "index.json"]
    mtimes = {path: path.stat().st_mtime_ns for path in results}
    indexes = {path: json.loads(path.read_text())["results"] for path in root.rglob("*/*/index.json")}
    time.sleep(0.01)
    resumed = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=os.environ)
    assert resumed.returncode == 0, resumed.stderr
    redone = {
        (json.loads(line)["subject"]["path"], json.loads(line)["experiment"]["name"])
        for line in resumed.stdout.splitlines()
    }
    assert not redone & done_before
    after = json.loads((root / "manifest.json").read_text())
    pairs = [(entry["image"], entry["experiment"]) for entry in after["results"]]
    assert len(pairs) == len(set(pairs)) == 48
    changed = [path.relative_to(root) for path, mtime in mtimes.items() if path.stat().st_mtime_ns != mtime]
    assert not changed
    for path, entries in indexes.items():
        now = json.loads(path.read_text())["results"]
        assert {name: now.get(name) for name in entries} == entries, path.relative_to(root)


@pytest.mark.parametrize("name", ["lecture.toml", "sweep.toml"])
def test_the_shipped_configs_are_valid_for_the_default_model(name, monkeypatch):
    """Every key of the shipped configs converts and every experiment passes its usage checks (no weights needed)."""
    import vitcli.cli  # noqa: F401  (registers the commands the configs name)
    from vitcli.batch.config import load_config
    from vitcli.batch.execute import plan_experiments
    from vitcli.context import CommandContext
    from vitcli.spec import WeightsSpec

    config = load_config(Path(__file__).resolve().parents[1] / "configs" / name)
    context = CommandContext("run", WeightsSpec(), "cpu", None, Path("unused"), "table", True)
    experiments = plan_experiments(context, config)
    assert config.images and all(Path(image).exists() for image in config.images)
    assert len([job for experiment in experiments for job in experiment.jobs]) == len(config.experiments)
