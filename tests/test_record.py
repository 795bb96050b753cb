"""A run's record (issue 19): JSON lines per process, views built from every record, resume by content and across
shard layouts, results about the image set from the stored results of the whole set, and the manifest's shape."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas
import pytest
from PIL import Image

from vitcli.batch.manifest import summary_frame
from vitcli.batch.record import RECORDS, read_record, record_files

from configs import write_config
from conftest import RANDOM_CPU

VITCLI = shutil.which("vitcli", path=str(Path(sys.executable).parent)) or "vitcli"
ROOT = Path(__file__).resolve().parents[1]

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

FAITHFULNESS = """
name = "faith"
images = {images}
[model]
weights = "random"
seed = 0
device = "cpu"
[[experiments]]
command = "explain"
method = ["rollout", "attention"]
faithfulness = true
steps = 2
random-orders = 2
"""


def pictures(folder: Path, count: int, size: int = 64) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(count):
        pixels = np.random.default_rng(index).integers(0, 256, (size, size, 3), dtype=np.uint8)
        path = folder / f"im{index}.png"
        Image.fromarray(pixels).save(path)
        paths.append(path)
    return paths


def manifest(root: Path, name: str = "manifest.json") -> dict:
    return json.loads((root / name).read_text())


def pairs(document: dict) -> list[tuple[str, str]]:
    return [(Path(entry["image"]).name if entry["image"] else "", entry["experiment"]) for entry in document["results"]]


def one_line(stderr: str) -> str:
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    return stderr.strip()


# ----- the record: one file per process, torn and bad lines


def test_each_run_appends_one_line_per_result_to_its_own_record_file(cli, workdir):
    images = pictures(workdir / "pics", 2)
    config = write_config(workdir, images, CONFIG)
    assert cli("run", config).exit_code == 0
    root = workdir / "outputs" / "pair"
    (first,) = record_files(root)
    lines = [json.loads(line) for line in first.read_text().splitlines()]
    assert [line["kind"] for line in lines] == ["run"] + ["result"] * 4
    assert lines[0]["identity"] == manifest(root)["identity"]
    # A second process (a resume with a third image) writes a file of its own and never touches the first.
    before = first.read_bytes()
    more = pictures(workdir / "more", 3)[2:]
    assert cli("run", config, *images, *more).exit_code == 0
    assert first.read_bytes() == before and len(record_files(root)) == 2
    assert len(manifest(root)["results"]) == 6


def test_a_torn_last_line_is_ignored_and_its_result_redone(cli, workdir):
    config = write_config(workdir, pictures(workdir / "pics", 2), CONFIG)
    assert cli("run", config).exit_code == 0
    root = workdir / "outputs" / "pair"
    (path,) = record_files(root)
    text = path.read_text()
    path.write_text(text[: len(text) - 40])  # what a kill during the last append leaves
    again = cli("run", config, "-f", "jsonl")
    assert again.exit_code == 0, again.stderr
    assert "warning" not in again.stderr
    assert len(again.stdout.splitlines()) == 1  # the torn line's result, and only it
    assert len(manifest(root)["results"]) == 4


def test_an_unreadable_record_line_is_reported_and_its_work_redone(cli, workdir):
    """Item 5: a line of the wrong shape is unusable; resume says so on stderr and redoes the work."""
    config = write_config(workdir, pictures(workdir / "pics", 1), CONFIG)
    assert cli("run", config).exit_code == 0
    root = workdir / "outputs" / "pair"
    (path,) = record_files(root)
    lines = path.read_text().splitlines()
    damaged = json.loads(lines[1])
    damaged["files"] = "x"
    path.write_text("\n".join([lines[0], json.dumps(damaged), "{not json", *lines[2:]]) + "\n")
    again = cli("run", config, "-f", "jsonl")
    assert again.exit_code == 0, again.stderr
    warnings = [line for line in again.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2, again.stderr
    shown = path.relative_to(workdir)
    assert f"{shown} line 2: files: must be a list" in warnings[0] and "redone" in warnings[0]
    assert f"{shown} line 3 is not valid JSON" in warnings[1]
    assert [json.loads(line)["experiment"]["name"] for line in again.stdout.splitlines()] == [damaged["experiment"]]


def test_the_latest_line_wins_whichever_file_holds_it(tmp_path):
    folder = tmp_path / RECORDS
    folder.mkdir()
    run = {"kind": "run", "name": "n", "identity": "i", "shard": None, "config": {}, "provenance": {}}
    entry = {
        "kind": "result",
        "image": "a.png",
        "image_sha256": "s",
        "subject": "a",
        "experiment": "e",
        "command": "c",
        "settings": {},
        "files": [],
        "compute_seconds": 0,
        "write_seconds": 0,
    }
    (folder / "b.jsonl").write_text(
        json.dumps({**run, "at": 1}) + "\n" + json.dumps({**entry, "at": 3, "summary": {"v": "new"}}) + "\n"
    )
    (folder / "c.jsonl").write_text(
        json.dumps({**run, "at": 2}) + "\n" + json.dumps({**entry, "at": 2, "summary": {"v": "old"}}) + "\n"
    )
    record = read_record(tmp_path, pytest.fail)
    assert record.results["a", "e"]["summary"] == {"v": "new"}
    assert [run["at"] for run in record.runs] == [1, 2]


# ----- resume by content, across shard layouts, and every invocation recorded


def test_a_replaced_image_is_recomputed_and_the_summary_follows_it(cli, workdir):
    (image,) = pictures(workdir / "pics", 1)
    config = write_config(workdir, [image], CONFIG)
    assert cli("run", config).exit_code == 0
    root = workdir / "outputs" / "pair"
    old = pandas.read_csv(root / "summary.csv").iloc[0]
    Image.fromarray(np.full((64, 64, 3), 200, dtype=np.uint8)).save(image)  # another picture, same path
    again = cli("run", config, "-f", "jsonl")
    assert again.exit_code == 0, again.stderr
    assert len(again.stdout.splitlines()) == 2 and "skipped" not in again.stderr
    new = pandas.read_csv(root / "summary.csv").iloc[0]
    import hashlib

    assert new["image_sha256"] == hashlib.sha256(image.read_bytes()).hexdigest() != old["image_sha256"]
    single = json.loads(cli("predict", image, *RANDOM_CPU, "-k", "3", "-f", "json", "-o", "single").stdout)
    assert new["predict_top1_probability"] == pytest.approx(single["results"][0]["result"]["top"][0]["probability"])


@pytest.mark.slow  # several seconds: `make test` leaves it to CI's full run
def test_a_result_is_done_wherever_it_was_recorded_in_the_run_folder(cli, workdir):
    """Item 12: an unsharded run, then both shards: nothing is redone; and the other way round."""
    images = pictures(workdir / "pics", 3)
    config = write_config(workdir, images, CONFIG)
    assert cli("run", config, "-o", "a").exit_code == 0
    for index in (1, 2):
        shard = cli("run", config, "-o", "a", "--shard", f"{index}/2", "-f", "jsonl")
        assert shard.exit_code == 0 and shard.stdout == "", shard.stderr
        assert "skipped" in shard.stderr
    for index in (1, 2):
        assert cli("run", config, "-o", "b", "--shard", f"{index}/2").exit_code == 0
    whole = cli("run", config, "-o", "b", "-f", "jsonl")
    assert whole.exit_code == 0 and whole.stdout == "" and "skipped 6 results" in whole.stderr
    assert sorted(pairs(manifest(workdir / "b" / "pair"))) == sorted(pairs(manifest(workdir / "a" / "pair")))


def test_every_invocation_is_recorded_and_merge_covers_all_images(cli, workdir):
    """Item 7 (issue 19): a re-run with other images keeps the first run's results; `runs` lists both invocations and
    `config` and `provenance` are the latest's. Issue 27 item 6: the re-run's views are of its own images, the first
    run's listed as not in this run; `vitcli merge` of the folder covers both."""
    first, second = pictures(workdir / "pics", 2)
    config = write_config(workdir, [first], CONFIG)
    assert cli("run", config).exit_code == 0
    assert cli("run", config, second, "--batch-size", "3").exit_code == 0
    document = manifest(workdir / "outputs" / "pair")
    assert [run["images"] for run in document["runs"]] == [1, 1]
    assert document["runs"][0]["record"] != document["runs"][1]["record"]
    assert document["config"]["model"]["batch-size"] == 3
    assert document["config"]["images"] == [str(second)] and document["not_in_this_run"] == [str(first)]
    assert {image for image, _ in pairs(document)} == {"im1.png"}
    assert cli("merge", workdir / "outputs" / "pair").exit_code == 0
    document = manifest(workdir / "outputs" / "pair")
    assert document["config"]["images"] == sorted([str(first), str(second)]) and document["not_in_this_run"] == []
    assert {image for image, _ in pairs(document)} == {"im0.png", "im1.png"}


def test_command_line_weights_win_over_the_configs(cli, workdir, vit):
    """Item 8: `--weights random` replaces the config's checkpoint; `--checkpoint` its `weights = "random"`."""
    import torch

    checkpoint = workdir / "w.pth"
    torch.save(vit.net.state_dict(), checkpoint)
    images = pictures(workdir / "pics", 1)
    with_checkpoint = CONFIG.replace('weights = "random"\nseed = 0', 'checkpoint = "w.pth"')
    result = cli("run", write_config(workdir, images, with_checkpoint), "--weights", "random", "-o", "r")
    assert result.exit_code == 0, result.stderr
    assert manifest(workdir / "r" / "pair")["provenance"]["weights"]["source"] == "random"
    assert "checkpoint" not in manifest(workdir / "r" / "pair")["config"]["model"]
    result = cli("run", write_config(workdir, images, CONFIG), "--checkpoint", checkpoint, "-o", "c")
    assert result.exit_code == 0, result.stderr
    assert manifest(workdir / "c" / "pair")["provenance"]["weights"]["source"] == "checkpoint"


# ----- results about the image set: the same numbers however the set was computed


def across(root: Path) -> dict[str, dict]:
    (path,) = root.glob("*/set-*/*-across-images.json")
    document = json.loads(path.read_text())
    return {row["method"]: row for row in document["result"]["methods"]} | {"": document["experiment"]["settings"]}


def assert_same_numbers(left: dict, right: dict) -> None:
    assert left.keys() == right.keys()
    for method, row in left.items():
        for key, value in row.items():
            if isinstance(value, float):
                assert right[method][key] == pytest.approx(value, abs=1e-6), (method, key)
            else:
                assert right[method][key] == value, (method, key)


@pytest.mark.slow  # several seconds: `make test` leaves it to CI's full run
def test_across_images_numbers_equal_a_fresh_runs_after_resume_extension_and_shards(cli, workdir):
    images = pictures(workdir / "pics", 3)
    config = write_config(workdir, images, FAITHFULNESS)
    assert cli("run", config, "-o", "fresh").exit_code == 0
    fresh = across(workdir / "fresh" / "faith")
    assert fresh[""]["images"] == 3 and fresh["rollout"]["images"] == 3
    # Extended: two images first, then all three (the third computed, the first two read back).
    assert cli("run", config, *images[:2], "-o", "extended").exit_code == 0
    extended = cli("run", config, "-o", "extended", "-f", "jsonl")
    assert [
        json.loads(line)["experiment"]["name"].endswith("-across-images") for line in extended.stdout.splitlines()
    ] == [
        False,
        True,
    ]
    (path,) = [
        p
        for p in (workdir / "extended" / "faith").glob("*/set-*/*-across-images.json")
        if "im2" not in str(p) and json.loads(p.read_text())["experiment"]["settings"]["images"] == 3
    ]
    assert_same_numbers(
        fresh,
        {
            **{row["method"]: row for row in json.loads(path.read_text())["result"]["methods"]},
            "": json.loads(path.read_text())["experiment"]["settings"],
        },
    )
    # Sharded into one folder, then merged: the merge recomputes the set's numbers over every shard.
    for index in (1, 2):
        assert cli("run", config, "-o", "sharded", "--shard", f"{index}/2").exit_code == 0
    merged = cli("merge", workdir / "sharded" / "faith")
    assert merged.exit_code == 0, merged.stderr
    document = manifest(workdir / "sharded" / "faith")
    (entry,) = [entry for entry in document["results"] if entry["experiment"].endswith("-across-images")]
    result = json.loads(
        (workdir / "sharded" / "faith" / next(f for f in entry["files"] if f.endswith(".json"))).read_text()
    )
    assert_same_numbers(
        fresh, {**{row["method"]: row for row in result["result"]["methods"]}, "": result["experiment"]["settings"]}
    )


# ----- views: column order, the terminal table, merged config


def test_summary_columns_follow_the_configured_order_and_number_naturally():
    """Item 22: predict's columns first when configured first; block 6 before block 12 when nothing says."""
    entries = [
        {"image": "a", "image_sha256": "s", "experiment": name, "command": command, "summary": {f"{command}_x": 1}}
        for name, command in (("attention-b12", "attend"), ("attention-b6", "attend"), ("predict-k5", "predict"))
    ]
    natural = list(summary_frame(entries).columns)
    assert natural == ["image", "image_sha256", "attention-b6.attend_x", "attention-b12.attend_x", "predict_x"]
    configured = list(summary_frame(entries, ["predict-k5", "attention-b12", "attention-b6"]).columns)
    assert configured == ["image", "image_sha256", "predict_x", "attention-b12.attend_x", "attention-b6.attend_x"]


@pytest.mark.slow  # several seconds: `make test` leaves it to CI's full run
def test_the_terminal_summary_says_what_it_left_out_and_counts_in_words(cli, workdir, monkeypatch):
    import vitcli.batch.execute

    monkeypatch.setattr(vitcli.batch.execute, "FEW_COLUMNS", 2)
    config = write_config(workdir, pictures(workdir / "pics", 7), CONFIG)
    result = cli("run", config)
    assert result.exit_code == 0
    (line,) = [line for line in result.stderr.splitlines() if "leaves out" in line]
    columns = list(pandas.read_csv(workdir / "outputs" / "pair" / "summary.csv").columns)
    assert line.endswith(", ".join(columns[4:])) and f"leaves out {len(columns) - 4} columns" in line
    assert list(pandas.read_csv(workdir / "outputs" / "pair" / "summary.csv").columns)[2].startswith("predict")
    single = cli("run", config, pictures(workdir / "one", 1)[0], "-o", "one")
    assert ": 1 image (all numbers" in single.stdout.replace("\n", " ") or "1 image " in single.stdout


@pytest.mark.slow  # several seconds: `make test` leaves it to CI's full run
def test_a_merged_manifest_covers_every_shards_images_and_a_refusal_names_the_difference(cli, workdir):
    """Item 11."""
    images = pictures(workdir / "pics", 3)
    config = write_config(workdir, images, CONFIG)
    for index, folder in ((1, "m1"), (2, "m2")):
        assert cli("run", config, "--shard", f"{index}/2", "-o", folder).exit_code == 0
    merged = cli("merge", workdir / "m1" / "pair", workdir / "m2" / "pair", "--into", workdir / "all")
    assert merged.exit_code == 0, merged.stderr
    document = manifest(workdir / "all")
    assert document["config"]["images"] == sorted(str(image) for image in images)
    assert sorted(document["config"]["output_dir"]) == ["m1", "m2"]
    assert len(document["results"]) == 6 and len(document["runs"]) == 2
    other = write_config(workdir, images, CONFIG.replace("top-k = 3", "top-k = 4"), "other.toml")
    assert cli("run", other, "-o", "m3").exit_code == 0
    refused = cli("merge", workdir / "m1" / "pair", workdir / "m3" / "pair", "--into", workdir / "x")
    assert refused.exit_code == 2
    assert '{"command": "predict", "top-k": 3} vs {"command": "predict", "top-k": 4}' in one_line(refused.stderr)


# ----- manifest shapes, --into, [output] dir, symbolic links (items 5 and 9)


@pytest.mark.parametrize(
    ("damage", "key"),
    [
        (lambda data: data["results"][0].pop("files"), "results[0].files: missing"),
        (lambda data: data.update(results="oops"), "results: must be a list"),
        (lambda data: data["results"].__setitem__(0, {"foo": 1}), "results[0].image: missing"),
        (lambda data: data["results"][0].update(files="x"), "results[0].files: must be a list"),
    ],
)
def test_a_manifest_of_the_wrong_shape_is_one_line_naming_file_and_key(cli, workdir, damage, key):
    config = write_config(workdir, pictures(workdir / "pics", 1), CONFIG)
    assert cli("run", config, "--shard", "1/1").exit_code == 0
    path = workdir / "outputs" / "pair" / "manifest-shard1of1.json"
    shutil.rmtree(workdir / "outputs" / "pair" / RECORDS)  # a copied folder of an older vitcli: manifests only
    data = json.loads(path.read_text())
    damage(data)
    path.write_text(json.dumps(data))
    for command in (("merge", path.parent, "--into", workdir / "m"), ("report", path.parent)):
        result = cli(*command)
        assert result.exit_code == 1, (command, result.stderr)
        assert f"{path}: {key}" in one_line(result.stderr)


def test_an_index_entry_of_the_wrong_shape_is_reported_and_redone(cli, workdir):
    config = write_config(workdir, pictures(workdir / "pics", 1), CONFIG)
    assert cli("run", config).exit_code == 0
    (index,) = (workdir / "outputs" / "pair").glob("*/im0-*/index.json")
    data = json.loads(index.read_text())
    data["results"]["predict-k3"]["files"] = "x"
    index.write_text(json.dumps(data))
    again = cli("run", config, "-f", "jsonl")
    assert again.exit_code == 0, again.stderr
    assert f"warning: {index.relative_to(workdir)}: results.predict-k3.files must be" in again.stderr
    assert [json.loads(line)["experiment"]["name"] for line in again.stdout.splitlines()] == ["predict-k3"]


def test_empty_output_folders_and_files_for_into_are_usage_errors(cli, workdir, no_model_load):
    images = pictures(workdir / "pics", 1)
    empty = write_config(workdir, images, CONFIG + '[output]\ndir = ""\n')
    result = cli("run", empty)
    assert result.exit_code == 2 and "output.dir: is empty" in one_line(result.stderr)
    assert cli("run", write_config(workdir, images, CONFIG), "-o", "").exit_code == 2
    (workdir / "a_file").write_text("")
    (workdir / "run_dir").mkdir()
    result = cli("merge", workdir / "run_dir", "--into", workdir / "a_file")
    assert result.exit_code == 2 and "is a file" in one_line(result.stderr)


@pytest.fixture
def no_model_load(monkeypatch):
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))


@pytest.mark.parametrize("planted", ["model folder", "lock"])
def test_nothing_is_written_through_a_symbolic_link_planted_in_the_output_folder(cli, workdir, planted):
    images = pictures(workdir / "pics", 1)
    config = write_config(workdir, images, CONFIG)
    outside = workdir / "outside"
    outside.mkdir()
    root = workdir / "outputs" / "pair"
    if planted == "model folder":
        root.mkdir(parents=True)
        (root / "vit_tiny_patch16_224.augreg_in21k_ft_in1k-random-s0").symlink_to(outside)
    else:
        assert cli("run", config).exit_code == 0
        (lock,) = root.glob("*/im0-*/.index.lock")
        lock.unlink()
        lock.symlink_to(outside / "planted.lock")
    result = cli("run", config, "--force")
    assert result.exit_code == 1
    assert "is a symbolic link inside" in one_line(result.stderr)
    assert list(outside.iterdir()) == []


@pytest.mark.slow
def test_two_concurrent_runs_with_different_images_both_survive(tmp_path):
    """Issue 19: two runs of one config into one folder at once, each with its own images: both records survive,
    the views of the last to finish list its own images and the other's as not in this run (issue 27 item 6), and
    `vitcli merge` of the folder lists every image in manifest.json and summary.csv."""
    images = pictures(tmp_path / "pics", 8)
    config = write_config(tmp_path, images, CONFIG)
    command = [VITCLI, "run", str(config), "--batch-size", "1", "-q"]
    runs = [
        subprocess.Popen([*command, *map(str, half)], cwd=tmp_path, stderr=subprocess.PIPE, text=True)
        for half in (images[:4], images[4:])
    ]
    for run in runs:
        assert run.wait(timeout=600) == 0, run.stderr.read()
    root = tmp_path / "outputs" / "pair"
    views = manifest(root)
    assert {Path(image) for image in views["config"]["images"] + views["not_in_this_run"]} == set(images)
    assert len(views["config"]["images"]) == 4
    merged = subprocess.run([VITCLI, "merge", str(root)], cwd=tmp_path, capture_output=True, text=True)
    assert merged.returncode == 0, merged.stderr
    assert {Path(entry["image"]) for entry in manifest(root)["results"]} == set(images)
    assert set(pandas.read_csv(root / "summary.csv")["image"]) == {str(image) for image in images}
    assert len(record_files(root)) == 2
