"""The shell scripts in examples/, run with bash as users run them.

examples/slurm-array.sh is checked here without Slurm: stand-ins for `sbatch` and `vitcli` on PATH record the
arguments they get, with the variables Slurm gives an array task (the real cluster run is tests/test_slurm.py).
examples/batch.sh runs the real vitcli on a one-experiment config.

Broken on purpose to watch them fail: batch.sh's old `folder=${1:-...}; shift` (options first taken as the folder)
fails the usage-error and options-first tests (the usage error came with "some images failed"); the shard number
taken as SLURM_ARRAY_TASK_ID itself fails the 0-based array case (--shard 0/2).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pandas
import pytest

REPO = Path(__file__).resolve().parents[1]
SLURM_ARRAY = REPO / "examples" / "slurm-array.sh"
BATCH = REPO / "examples" / "batch.sh"
VITCLI = shutil.which("vitcli", path=str(Path(sys.executable).parent)) or "vitcli"

# A stand-in that appends its working folder and arguments (shell-quoted) as one line to $CALLS/NAME.
RECORDER = """#!/usr/bin/env bash
printf '%q ' "$PWD" "$@" >> "$CALLS/{name}"
echo >> "$CALLS/{name}"
{extra}
"""


def clean_environment(**variables: str) -> dict[str, str]:
    """os.environ without any Slurm variables (the tests may run inside a Slurm job), plus `variables`."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("SLURM_", "SBATCH_"))}
    return {**env, **variables}


@pytest.fixture
def stand_ins(tmp_path):
    """A bin folder with recording `sbatch` (answers "Submitted batch job 99") and `vitcli`, and their calls."""
    bin_folder, calls = tmp_path / "bin", tmp_path / "calls"
    bin_folder.mkdir()
    calls.mkdir()
    for name, extra in (("sbatch", 'echo "Submitted batch job 99"'), ("vitcli", "")):
        path = bin_folder / name
        path.write_text(RECORDER.format(name=name, extra=extra))
        path.chmod(0o755)
    return bin_folder, calls


def recorded(calls: Path, name: str) -> list[list[str]]:
    path = calls / name
    return [shlex.split(line) for line in path.read_text().splitlines()] if path.exists() else []


def array_task(stand_ins, tmp_path, task: int, first: int, last: int, *args: str, **variables: str):
    bin_folder, calls = stand_ins
    slurm = {
        "SLURM_SUBMIT_DIR": str(tmp_path),
        "SLURM_ARRAY_JOB_ID": "77",
        "SLURM_ARRAY_TASK_ID": str(task),
        "SLURM_ARRAY_TASK_MIN": str(first),
        "SLURM_ARRAY_TASK_MAX": str(last),
        "SLURM_ARRAY_TASK_COUNT": str(last - first + 1),
    }
    env = clean_environment(
        PATH=f"{bin_folder}:{os.environ['PATH']}", CALLS=str(calls), VITCLI=str(bin_folder / "vitcli"),
        **{**slurm, **variables},
    )  # fmt: skip
    return subprocess.run(["bash", SLURM_ARRAY, *args], capture_output=True, text=True, env=env, timeout=60)


def test_each_array_task_runs_its_shard_with_device_and_options_and_the_first_submits_the_merge(stand_ins, tmp_path):
    bin_folder, calls = stand_ins
    options = ("--weights", "random", "--seed", "3")
    first = array_task(stand_ins, tmp_path, 0, 0, 1, "my photos", *options, DEVICE="cpu", OUT="out dir")
    second = array_task(stand_ins, tmp_path, 1, 0, 1, "my photos", *options, DEVICE="cpu", OUT="out dir")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    common = ["run", "configs/sweep.toml", "my photos", "-o", "out dir", "--device", "cpu", "-q"]
    assert recorded(calls, "vitcli") == [
        [str(tmp_path), *common, "--shard", "1/2", *options],
        [str(tmp_path), *common, "--shard", "2/2", *options],
    ]
    # Only the first task submits the merge job: after every task of array 77 has ended with exit 0.
    ((folder, *arguments),) = recorded(calls, "sbatch")
    assert folder == str(tmp_path)
    assert "--dependency=afterok:77" in arguments and "--kill-on-invalid-dep=yes" in arguments
    (wrap,) = [argument.removeprefix("--wrap=") for argument in arguments if argument.startswith("--wrap=")]
    (calls / "vitcli").unlink()
    subprocess.run(["bash", "-c", wrap], env=clean_environment(CALLS=str(calls)), cwd=tmp_path, check=True, timeout=60)
    assert recorded(calls, "vitcli") == [
        [str(tmp_path), "merge", "out dir/sweep"],
        [str(tmp_path), "report", "out dir/sweep"],
    ]


def test_an_array_task_defaults_to_cuda_and_runs_its_shard_even_if_the_merge_cannot_be_submitted(stand_ins, tmp_path):
    bin_folder, calls = stand_ins
    (bin_folder / "sbatch").write_text(
        "#!/usr/bin/env bash\necho 'sbatch: error: Job dependency problem' >&2\nexit 1\n"
    )
    result = array_task(stand_ins, tmp_path, 1, 1, 4, "photos", CONFIG="my.toml", NAME="mine")
    assert result.returncode == 0, result.stderr
    assert "could not submit the merge job: run `vitcli merge outputs/mine && vitcli report outputs/mine`" in (
        result.stderr
    )
    ((_, *arguments),) = recorded(calls, "vitcli")
    assert arguments == ["run", "my.toml", "photos", "-o", "outputs", "--device", "cuda", "-q", "--shard", "1/4"]


@pytest.mark.parametrize(
    ("case", "args", "slurm", "message"),
    [
        ("no folder", [], True, "usage: [DEVICE=cpu] sbatch [sbatch options] examples/slurm-array.sh PHOTOS_DIR"),
        ("options first", ["--weights", "random"], True, "usage: [DEVICE=cpu] sbatch"),
        ("not in a job", ["photos"], False, "not an array task: submit it with sbatch"),
        ("array with gaps", ["photos"], "gaps", "--array must be a range without gaps or steps (like 1-4)"),
    ],
)
def test_the_slurm_script_refuses_bad_usage_in_one_line_with_exit_2(stand_ins, tmp_path, case, args, slurm, message):
    bin_folder, calls = stand_ins
    if slurm is False:
        env = clean_environment(PATH=f"{bin_folder}:{os.environ['PATH']}", CALLS=str(calls))
        result = subprocess.run(["bash", SLURM_ARRAY, *args], capture_output=True, text=True, env=env, timeout=60)
    else:
        count = {"SLURM_ARRAY_TASK_COUNT": "2"} if slurm == "gaps" else {}  # --array=1,3: two tasks from 1 to 3
        result = array_task(stand_ins, tmp_path, 1, 1, 3, *args, **count)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
    assert recorded(calls, "vitcli") == [] and recorded(calls, "sbatch") == []


# ----- examples/batch.sh

PREDICT_CONFIG = """
name = "mini"
[model]
weights = "random"
[[experiments]]
command = "predict"
top-k = 3
"""


def batch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    config = tmp_path / "mini.toml"
    config.write_text(PREDICT_CONFIG)
    env = clean_environment(
        CONFIG=str(config), NAME="mini", OUT=str(tmp_path / "out"), VITCLI=VITCLI, PYTHONPATH=str(REPO)
    )
    env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run(["bash", BATCH, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)


def test_batch_stops_on_a_usage_error_without_claiming_that_images_failed(tmp_path):
    result = batch(tmp_path, "--weights", "nonsense")
    assert result.returncode == 2
    assert "Invalid value for '--weights'" in result.stderr
    assert "vitcli run exited 2 (see above); nothing to collect" in result.stderr
    assert "some images failed" not in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_batch_with_options_first_runs_the_example_images(tmp_path):
    result = batch(tmp_path, "--weights", "random", "--seed", "0", "--device", "cpu")
    assert result.returncode == 0, result.stderr
    assert "some images failed" not in result.stderr
    run = tmp_path / "out" / "mini"
    summary = pandas.read_csv(run / "summary.csv")
    assert sorted(Path(image).name for image in summary["image"]) == ["Persian_98.jpg", "newfoundland_31.jpg"]
    assert "summary: " in result.stdout and "(2 images)" in result.stdout
    assert (run / "report.html").stat().st_size > 0


@pytest.mark.slow
def test_batch_says_some_images_failed_only_when_they_did_and_exits_1(tmp_path, photo):
    folder = tmp_path / "photos"
    folder.mkdir()
    shutil.copy(photo, folder / "good.jpg")
    (folder / "broken.jpg").write_text("not a picture")
    result = batch(tmp_path, str(folder), "--weights", "random", "--device", "cpu")
    assert result.returncode == 1, result.stderr
    run = tmp_path / "out" / "mini"
    assert f"some images failed: see {run}/manifest.json; collecting the others" in result.stderr
    manifest = json.loads((run / "manifest.json").read_text())
    assert [Path(failure["image"]).name for failure in manifest["failures"]] == ["broken.jpg"]
    assert (run / "report.html").stat().st_size > 0
    if shutil.which("jq"):  # step 4: the stream of top-1s has the good image alone
        assert [line.split("\t")[0] for line in (run / "top1.tsv").read_text().splitlines()] == [
            str(folder / "good.jpg")
        ]
