"""A run's views and record, fourth round (issue 27): records of two configs in one folder, one image spelled two
ways, a deleted image, record lines of the wrong nested shape, damaged manifests beside the records, and counts in
words."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pandas
import pytest
from test_record import CONFIG, manifest, one_line, pictures

from vitcli.batch.record import RECORDS, record_files

from configs import write_config

FAST = CONFIG + "[output]\nfigures = false\n"
OTHER = FAST.replace("top-k = 3", "top-k = 4")


def run_line(path: Path) -> dict:
    return json.loads(path.read_text().splitlines()[0])


def experiments(document: dict) -> set[str]:
    return {entry["experiment"] for entry in document["results"]}


# ----- item 4: `merge` of a folder holding records of two configs


@pytest.fixture
def two_configs(cli, workdir) -> tuple[Path, Path, Path]:
    """OUTPUT/pair holding shard 1/2 of run.toml and, copied in, shard 2/2 of other.toml (same name): its record
    and its manifest."""
    images = pictures(workdir / "pics", 2)
    first = write_config(workdir, images, FAST)
    second = write_config(workdir, images, OTHER, "other.toml")
    assert cli("run", first, "--shard", "1/2").exit_code == 0
    assert cli("run", second, "--shard", "2/2", "-o", "elsewhere").exit_code == 0
    root = workdir / "outputs" / "pair"
    for path in record_files(workdir / "elsewhere" / "pair"):
        shutil.copy(path, root / RECORDS)
    shutil.copy(workdir / "elsewhere" / "pair" / "manifest-shard2of2.json", root)
    return root, first, second


def test_merge_refuses_records_of_two_configs_in_one_folder_naming_both(cli, workdir, two_configs):
    root, first, second = two_configs
    identities = {run_line(path)["identity"] for path in record_files(root)}
    assert len(identities) == 2
    refused = cli("merge", root, "--into", workdir / "merged")
    assert refused.exit_code == 2
    line = one_line(refused.stderr)
    assert str(first) in line and str(second) in line and "--config" in line
    assert all(identity[:12] in line for identity in identities)
    assert not (workdir / "merged").exists()
    # Both `run` and `report` refuse the folder too.
    assert cli("run", first).exit_code == 2
    assert cli("report", root).exit_code == 2


@pytest.mark.parametrize("how", ["path", "identity"])
def test_merge_config_merges_only_the_chosen_configs_records(cli, workdir, two_configs, how):
    root, first, second = two_configs
    (chosen_file,) = [path for path in record_files(root) if run_line(path)["config"]["path"] == str(second)]
    chosen = run_line(chosen_file)
    value = str(second) if how == "path" else chosen["identity"][:12]
    merged = cli("merge", root, "--into", workdir / "merged", "--config", value)
    assert merged.exit_code == 0, merged.stderr
    document = manifest(workdir / "merged")
    assert document["identity"] == chosen["identity"]
    assert experiments(document) == {"predict-k4", "patches-p63-v4"}
    assert len({entry["image"] for entry in document["results"]}) == 1  # shard 2/2's image only
    assert [run["record"] for run in document["runs"]] == [f"{RECORDS}/{chosen_file.name}"]


def test_merge_config_that_names_no_recorded_config_is_one_line(cli, workdir, two_configs):
    root, _, _ = two_configs
    refused = cli("merge", root, "--into", workdir / "merged", "--config", "nothing.toml")
    assert refused.exit_code == 2
    assert "nothing.toml" in one_line(refused.stderr)


# ----- item 5: one image spelled relative and absolute is one row; integer columns stay integers


def test_one_image_spelled_two_ways_is_one_row_and_integer_columns_stay_integers(cli, workdir):
    pictures(workdir / "pics", 1)
    config = write_config(workdir, [], FAST)
    assert cli("run", config, "pics/im0.png").exit_code == 0
    root = workdir / "outputs" / "pair"
    (path,) = record_files(root)
    lines = path.read_text().splitlines()
    kept = [line for line in lines if json.loads(line).get("experiment") != "patches-p63-v4"]
    path.write_text("\n".join(kept) + "\n")  # as if killed after predict: patches is redone by the resume
    again = cli("run", config, str(workdir / "pics" / "im0.png"))
    assert again.exit_code == 0, again.stderr
    assert "skipped 1 result " in again.stderr
    summary = pandas.read_csv(root / "summary.csv")
    assert len(summary) == 1
    assert summary["predict_top1_class"].dtype.kind == "i"
    assert {entry["image"] for entry in manifest(root)["results"]} == {str(workdir / "pics" / "im0.png")}


def test_integer_summary_columns_stay_integers_where_an_image_lacks_them():
    from vitcli.batch.manifest import summary_frame

    entries = [
        {"image": "a", "image_sha256": "s", "subject": "a", "experiment": "predict", "command": "predict",
         "summary": {"top1_class": 3, "probability": 0.5, "flag": True}},
        {"image": "b", "image_sha256": "t", "subject": "b", "experiment": "attend", "command": "attend",
         "summary": {"x": 1.5}},
    ]  # fmt: skip
    frame = summary_frame(entries)
    assert str(frame["top1_class"].dtype) == "Int64"
    assert frame.to_csv(index=False).splitlines()[1:] == ["a,s,,3,0.5,True", "b,t,1.5,,,"]  # attend first: natural


# ----- item 6: the views list exactly this run's images; others are "not in this run"


def test_a_deleted_image_leaves_the_views_and_is_listed_as_not_in_this_run(cli, workdir, report_of):
    images = pictures(workdir / "pics", 3)
    config = write_config(workdir, [workdir / "pics"], FAST)
    assert cli("run", config).exit_code == 0
    root = workdir / "outputs" / "pair"
    deleted = images[2]
    deleted.unlink()
    again = cli("run", config)
    assert again.exit_code == 0, again.stderr
    assert "2 of 2 images done; 1 image recorded earlier is not in this run" in again.stderr
    document = manifest(root)
    assert {entry["image"] for entry in document["results"]} == {str(image) for image in images[:2]}
    assert document["config"]["images"] == [str(image) for image in images[:2]]
    assert document["not_in_this_run"] == [str(deleted)]
    assert list(pandas.read_csv(root / "summary.csv")["image"]) == [str(image) for image in images[:2]]
    page = report_of(root)
    assert "Not in this run (1)" in page and "im2.png" in page
    # Its results stay on disk and in the records: `merge` of the folder lists every recorded image.
    assert cli("merge", root, "--into", workdir / "all").exit_code == 0
    assert len({entry["image"] for entry in manifest(workdir / "all")["results"]}) == 3


@pytest.fixture
def report_of(cli):
    def build(run: Path) -> str:
        result = cli("report", run)
        assert result.exit_code == 0, result.stderr
        return (run / "report.html").read_text(encoding="utf-8")

    return build


# ----- item 9: a record line validated whole, nested fields included


@pytest.mark.parametrize(
    ("line", "damage", "key"),
    [
        (0, lambda data: data["config"].update(images=5), "config.images: must be a list"),
        (0, lambda data: data["config"].update(images=[["a.png"]]), "config.images[0]: must be text"),
        (0, lambda data: data.update(shard="two"), "shard: must be"),
        (0, lambda data: data.update(result_names=[1]), "result_names[0]: must be text"),
        (1, lambda data: data.update(summary=[1, 2]), "summary: must be an object"),
        (1, lambda data: data.update(files=[3]), "files[0]: must be text"),
    ],
)
def test_a_record_line_with_a_nested_field_of_the_wrong_shape_is_reported_and_redone(cli, workdir, line, damage, key):
    config = write_config(workdir, pictures(workdir / "pics", 1), FAST)
    assert cli("run", config).exit_code == 0
    root = workdir / "outputs" / "pair"
    (path,) = record_files(root)
    lines = path.read_text().splitlines()
    data = json.loads(lines[line])
    damage(data)
    lines[line] = json.dumps(data)
    path.write_text("\n".join(lines) + "\n")
    shown = f"{path.relative_to(workdir)} line {line + 1}: {key}"
    merged = cli("merge", root, "--into", workdir / "merged")
    assert merged.exit_code == 0 and "Traceback" not in merged.stderr
    assert shown in merged.stderr and "redone" in merged.stderr
    again = cli("run", config, "-f", "jsonl")
    assert again.exit_code == 0, again.stderr
    assert shown in again.stderr
    # A run line of the wrong shape leaves its file's results of unknown config: they are redone too.
    redone = [json.loads(text)["experiment"]["name"] for text in again.stdout.splitlines()]
    assert redone == (["predict-k3", "patches-p63-v4"] if line == 0 else [data["experiment"]])


# ----- item 18: a damaged manifest beside the records is refused by `merge` as by `report`


@pytest.mark.parametrize("shards", [False, True])
def test_a_manifest_entry_without_files_beside_the_records_is_refused_by_merge_and_report(cli, workdir, shards):
    config = write_config(workdir, pictures(workdir / "pics", 2), FAST)
    for shard in ("1/2", "2/2") if shards else (None,):
        assert cli("run", config, *(["--shard", shard] if shard else [])).exit_code == 0
    root = workdir / "outputs" / "pair"
    path = root / ("manifest-shard2of2.json" if shards else "manifest.json")
    data = json.loads(path.read_text())
    data["results"][0].pop("files")
    path.write_text(json.dumps(data))
    for command in (("merge", root, "--into", workdir / "m"), ("report", root)):
        result = cli(*command)
        assert result.exit_code == 1, (command, result.stderr)
        assert f"{path}: results[0].files: missing" in one_line(result.stderr)


# ----- item 24: counts in words


def test_counts_say_one_failure_and_two_images(cli, workdir, report_of):
    from vitcli.output import counted

    assert [counted(count, "failure") for count in (0, 1, 2)] == ["0 failures", "1 failure", "2 failures"]
    images = pictures(workdir / "pics", 2)
    broken = workdir / "pics" / "broken.png"
    broken.write_text("not a picture")
    config = write_config(workdir, [*images, broken], FAST)
    assert cli("run", config).exit_code == 1
    root = workdir / "outputs" / "pair"
    merged = cli("merge", root)
    assert merged.exit_code == 0, merged.stderr
    assert "of 2 images;" in merged.stderr and "warning: 1 failure remains" in merged.stderr
    page = report_of(root)
    assert "2 images, 4 results, 1 failure;" in page and "1 failures" not in page


def test_a_missing_integer_cell_is_empty_in_the_report_and_the_terminal_table(tmp_path):
    """Integer columns are nullable (pandas' Int64): a missing cell must read as empty, never `<NA>`."""
    from vitcli.batch.execute import summary_table
    from vitcli.batch.manifest import Manifest, summary_frame
    from vitcli.report.sections import summary_section

    entries = [
        {"image": "a.png", "image_sha256": "s", "subject": "a", "experiment": "predict", "command": "predict",
         "summary": {"top1_class": 3}},
        {"image": "b.png", "image_sha256": "t", "subject": "b", "experiment": "attend", "command": "attend",
         "summary": {"x": 1.5}},
    ]  # fmt: skip
    timed = [{**entry, "compute_seconds": 0.0, "write_seconds": 0.0} for entry in entries]
    manifest_ = Manifest("n", "i", {}, {"weights_label": "random"}, None, timed)
    links = {"a.png": "#a", "b.png": "#b"}
    for interactive in (False, True):
        html = summary_section(summary_frame(entries), links, interactive, manifest_)
        assert "NA" not in html and ('<td class="number">3</td>' in html or "[3," in html or ",3]" in html), html
    from rich.console import Console

    table, _ = summary_table(manifest_, tmp_path)
    console = Console(record=True, width=200, file=io.StringIO())
    console.print(table)
    shown = console.export_text()
    assert "NA" not in shown and "nan" not in shown and " 3 " in shown, shown
