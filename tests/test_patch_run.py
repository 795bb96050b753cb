"""`patch` as a `vitcli run` experiment: each image of the run is CLEAN, patched into the config's one `corrupt`.

The oracle is the command line: each image's stored result equals `vitcli patch IMAGE CORRUPT`'s JSON body."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas
import pytest

from configs import write_config
from conftest import RANDOM_CPU

SETTINGS = ["--sites", "heads", "--sites", "attention", "--method", "activation", "--method", "attribution"]
CONFIG = """
name = "patched"
images = {images}
[model]
weights = "random"
seed = 0
device = "cpu"
[[experiments]]
command = "patch"
corrupt = {corrupt}
sites = ["heads", "attention"]
method = ["activation", "attribution"]
"""


def _same(run: object, single: object, where: str = "result") -> None:
    """Every number equal within 1e-6 and everything else equal, but the files' paths (relative on one side)."""
    if isinstance(single, dict):
        assert isinstance(run, dict) and set(run) == set(single), where
        for key in single:
            if key != "path":
                _same(run[key], single[key], f"{where}.{key}")
    elif isinstance(single, list):
        assert isinstance(run, list) and len(run) == len(single), where
        for index, (mine, theirs) in enumerate(zip(run, single, strict=True)):
            _same(mine, theirs, f"{where}[{index}]")
    elif isinstance(single, float):
        assert run == pytest.approx(single, abs=1e-6), where
    else:
        assert run == single, where


@pytest.fixture
def run_folder(workdir, photo, newfoundland, persian) -> Path:
    """A config in its own folder (not the working directory), naming its images and CORRUPT relative to itself;
    a copy of CORRUPT under another name is one of the images."""
    configs = workdir / "configs"
    pictures = configs / "pictures"
    pictures.mkdir(parents=True)
    for source in (photo, newfoundland):
        shutil.copy(source, pictures / source.name)
    shutil.copy(persian, pictures / "cat_copy.jpg")
    shutil.copy(persian, configs / "cat.jpg")
    write_config(configs, ["pictures"], CONFIG, corrupt="cat.jpg")
    return configs


@pytest.mark.slow  # several seconds: `make test` leaves it to CI's full run
def test_each_image_patched_into_corrupt_equals_the_command_line_and_corrupt_itself_fails(cli, workdir, run_folder):
    """Two CLEAN images into one CORRUPT (its forward and graph run once, kept on the job for both) give exactly
    `vitcli patch IMAGE CORRUPT`'s result; the copy of CORRUPT fails alone, in one line, and the run goes on.
    Seen to fail when the job's kept gradients were not keyed by (target, contrast) (the second image reused the
    first one's gradient) and when `corrupt` was read relative to the working directory."""
    result = cli("run", run_folder / "run.toml", "--no-figures")
    assert result.exit_code == 1, result.stderr  # one image failed
    failures = [line for line in result.stderr.splitlines() if "CORRUPT" in line]
    assert len(failures) == 1 and "cat_copy.jpg" in failures[0] and "the same bytes" in failures[0]
    root = workdir / "outputs" / "patched"
    manifest = json.loads((root / "manifest.json").read_text())
    assert [Path(failure["image"]).name for failure in manifest["failures"]] == ["cat_copy.jpg"]
    stored = {Path(entry["image"]).name: root / entry["files"][0] for entry in manifest["results"]}
    assert set(stored) == {"synthetic.jpg", "newfoundland_31.jpg"}
    targets = set()
    for name, path in stored.items():
        document = json.loads(path.with_suffix(".json").read_text())
        assert document["experiment"]["name"].startswith("patch-into-cat-")
        assert document["experiment"]["settings"]["corrupt"] == str(run_folder / "cat.jpg")
        single = cli(
            "patch", run_folder / "pictures" / name, run_folder / "cat.jpg", *RANDOM_CPU, *SETTINGS, "-f", "json"
        )
        assert single.exit_code == 0, single.stderr
        _same(document["result"], json.loads(single.stdout)["results"][0]["result"])
        targets.add(document["result"]["metric"]["target"]["index"])
    assert len(targets) == 2  # two (target, contrast) pairs: two gradients from CORRUPT's one graph

    summary = pandas.read_csv(root / "summary.csv")
    columns = [f"patch_{kind}_largest_{what}" for kind in ("attention", "heads") for what in ("site", "score")]
    assert {"patch_m_clean", "patch_m_corrupt", *columns, "patch_pearson", "patch_spearman"} <= set(summary.columns)
    for _, row in summary.iterrows():
        body = json.loads(stored[Path(row["image"]).name].with_suffix(".json").read_text())["result"]
        heads = body["sites"]["heads"]["activation"]
        block, head = max(
            ((b, h) for b in range(len(heads)) for h in range(len(heads[0]))), key=lambda at: abs(heads[at[0]][at[1]])
        )
        assert row["patch_heads_largest_site"] == f"B{block + 1}.H{head + 1}"
        assert row["patch_heads_largest_score"] == pytest.approx(heads[block][head], abs=1e-9)


@pytest.mark.slow  # several seconds: `make test` leaves it to CI's full run
def test_shards_of_a_patch_run_merge_into_the_whole_run(cli, workdir, run_folder, monkeypatch):
    """CORRUPT's forward runs once per process, not per image; each shard runs it for its own images; the merged
    summary.csv equals one run's, and a second run skips every stored result. The count was seen to fail (2) with
    the job's cache of CORRUPT turned off; the frame comparison fails on any image missing or differing."""
    import vitcli.experiments.patching as patching

    calls = []
    forward = patching.corrupt_forward
    monkeypatch.setattr(patching, "corrupt_forward", lambda *args: calls.append(1) or forward(*args))
    config = run_folder / "run.toml"
    cli("run", config, "--no-figures", "-o", "whole")
    assert len(calls) == 1  # two images patched into it
    for index in (1, 2):
        cli("run", config, "--no-figures", "--shard", f"{index}/2", "-o", "sharded")
    merged = cli("merge", workdir / "sharded" / "patched")
    assert merged.exit_code in (0, 1), merged.stderr  # the copy of CORRUPT stays a failure after the merge
    whole = pandas.read_csv(workdir / "whole" / "patched" / "summary.csv")
    combined = pandas.read_csv(workdir / "sharded" / "patched" / "summary.csv")
    assert len(whole) == 2
    pandas.testing.assert_frame_equal(whole, combined)
    again = cli("run", config, "--no-figures", "-o", "whole")
    assert "skipped 2 results already complete" in again.stderr


def test_config_paths_of_experiment_options_are_relative_to_the_config(cli, workdir, run_folder, newfoundland):
    """masks, reference (a glob) and corrupt are read relative to the config's folder, absolute paths as given.
    Seen to fail before `_experiment` resolved them (reference's glob matched nothing from the working directory)."""
    from vitcli.batch.config import load_config

    (run_folder / "masks").mkdir()
    text = f"""
images = ["pictures"]
[[experiments]]
command = "ablate"
mode = "mean"
reference = "pictures/*.jpg"
[[experiments]]
command = "explain"
masks = "masks"
[[experiments]]
command = "patch"
corrupt = {json.dumps(str(newfoundland))}
"""
    (run_folder / "paths.toml").write_text(text)
    config = load_config(run_folder / "paths.toml")
    ablate, explain, patch = (experiment.options for experiment in config.experiments)
    assert Path(ablate["reference"]) == run_folder / "pictures" / "*.jpg"
    assert len(config.experiments[0].jobs[0].reference) == 3
    assert Path(explain["masks"]) == run_folder / "masks"
    assert Path(patch["corrupt"]) == newfoundland


@pytest.mark.parametrize(
    ("experiment", "message"),
    [
        ('command = "patch"', "patch in a config needs `corrupt = IMAGE`"),
        ('command = "patch"\ncorrupt = "nowhere.jpg"', "is not an image file"),
        ('command = "patch"\ncorrupt = "pictures"', "is not an image file"),
    ],
)
def test_config_usage_errors_exit_2_before_the_model_loads(
    cli, workdir, run_folder, no_model_load, experiment, message
):
    """Seen to fail (exit 1, an internal error) when the builder did not check that `corrupt` is given."""
    (run_folder / "bad.toml").write_text(f'images = ["pictures"]\n[[experiments]]\n{experiment}\n')
    result = cli("run", run_folder / "bad.toml", *RANDOM_CPU)
    assert result.exit_code == 2
    assert message in result.stderr and "experiments[0]" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.fixture
def no_model_load(monkeypatch):
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
