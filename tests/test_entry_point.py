"""The `vitcli` program itself: help, completion, the installed entry point, and usage errors that come in one line
with exit 2 before any weights load."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import RANDOM_CPU

VITCLI = shutil.which("vitcli", path=str(Path(sys.executable).parent)) or "vitcli"
MODEL = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
COMMANDS = ("predict", "patches", "attend", "occlude-patches", "occlude-quadrants", "compare-patch-size")
BAD_INPUTS_MD = Path(__file__).with_name("BAD_INPUTS.md")


def run_vitcli(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONWARNINGS"}
    return subprocess.run(
        [VITCLI, *args], capture_output=True, text=True, cwd=cwd, env={**environment, **env}, timeout=300
    )


# ----- help and completion


def test_help_is_fast_because_it_imports_no_torch():
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, vitcli.cli; print(sorted({'torch', 'timm', 'matplotlib'} & set(sys.modules)))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "[]"
    result = run_vitcli("--help")
    assert result.returncode == 0
    for command in COMMANDS:
        assert command in result.stdout
    assert "--install-completion" in result.stdout


def test_bare_vitcli_shows_the_help():
    result = run_vitcli()
    assert result.returncode == 0 and result.stderr == ""
    assert "Usage: vitcli" in result.stdout and "predict" in result.stdout


def test_shell_completion_completes_command_names(tmp_path):
    result = run_vitcli(cwd=tmp_path, _VITCLI_COMPLETE="complete_bash", COMP_WORDS="vitcli pre", COMP_CWORD="1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["predict"]
    options = run_vitcli(
        cwd=tmp_path, _VITCLI_COMPLETE="complete_bash", COMP_WORDS="vitcli predict --top", COMP_CWORD="2"
    )
    assert options.stdout.split() == ["--top-k"]


def test_command_help_ends_with_examples_and_shows_flags_as_flags(cli):
    result = cli("predict", "--help")
    assert result.exit_code == 0
    lines = [line.strip(" │") for line in result.stdout.splitlines() if line.strip(" │")]
    assert lines[-1].startswith("$ vitcli predict") and any(line == "Examples" for line in lines[-5:])
    for flag in ("--quiet", "--debug", "--fail-fast", "--help"):
        (line,) = [line for line in lines if line.split()[:1] == [flag]]
        assert "<bool>" not in line, line
    (argument,) = [line for line in lines if line.split()[:1] == ["IMAGE"]]
    assert "<" not in argument, argument  # not Typer's <list[str]>
    for command in ("merge", "patches", "explain"):  # RUN_DIR...; repeatable --patch and --method
        assert "<list[" not in cli(command, "--help").stdout, command
    assert "--patch -p <str>" in " ".join(cli("patches", "--help").stdout.replace("│", " ").split())
    root = cli("--help").stdout.splitlines()
    for flag in ("--version", "--install-completion", "--show-completion", "--help"):
        (line,) = [line for line in root if line.strip(" │").split()[:1] == [flag]]
        assert "<" not in line, line
    assert not re.search(r"random\s+\.", result.stdout), "rich markup swallowed a [default: ...] in a help text"


# ----- usage errors: exit 2, one line, before the weights load


@pytest.fixture
def no_model_load(monkeypatch):
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["patches", "--patch", "P300"], "patch P300 does not exist: patches are P1..P196 or r0c0..r13c13"),
        (["patches", "--patch", "r14c0"], "grid position r14c0 is outside the 14x14 grid"),
        (["predict", "--top-k", "1001"], "--top-k must be between 1 and 1000 (the model's classes), not 1001"),
        (["predict", "--top-k", "0"], "--top-k must be between 1 and 1000"),
        (["predict", "--shard", "3/2"], "--shard 3/2: K must be between 1 and N (2)"),
        (["predict", "--shard", "x"], "--shard 'x': write it as K/N"),
        (["predict", "--shard", "0/4"], "K must be between 1 and N (4)"),
    ],
)
def test_usage_errors_exit_2_in_one_line_before_the_model_loads(cli, photo, no_model_load, args, message):
    command, *options = args
    result = cli(command, photo, *RANDOM_CPU, *options)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert result.stdout == ""


def test_contradicting_weight_sources_are_a_usage_error(cli, photo, workdir, no_model_load):
    (workdir / "w.safetensors").write_bytes(b"")
    result = cli("predict", photo, "--checkpoint", workdir / "w.safetensors", "--weights", "random")
    assert result.exit_code == 2 and "contradict" in result.stderr and result.stderr.count("\n") == 1


def test_debug_shows_the_traceback(cli, workdir):
    (workdir / "notes.jpg").write_text("not a JPEG")
    result = cli("predict", workdir / "notes.jpg", *RANDOM_CPU, "--fail-fast", "--debug")
    assert result.exit_code == 1 and "Traceback" in result.stderr


def test_asking_for_a_missing_gpu_is_an_error(cli, photo):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    result = cli("predict", photo, "--weights", "random", "--device", "cuda")
    assert result.exit_code == 1 and "no CUDA GPU is available" in result.stderr


MISSPELT_CHOICES = [
    (
        ("attend", "--view", "maps"),
        "'--view': 'maps' is not one of map, summary, rollout, all-blocks (did you mean map?)",
    ),
    (("explain", "--method", "gradcm"), "'gradcm' is not one of relevance, grad-rollout, gradcam,"),
    (
        ("occlude-quadrants", "--fill", "grey"),
        "'grey' is not one of gray, black, white, mean, blur (did you mean gray?)",
    ),
    (("predict", "--weights", "rand"), "'rand' is not one of pretrained, random (did you mean random?)"),
]


@pytest.mark.parametrize(
    ("arguments", "message"),
    MISSPELT_CHOICES,
    ids=lambda value: " ".join(value[:2]) if isinstance(value, tuple) else "",
)
def test_a_misspelt_choice_names_the_choices_and_the_closest_one(cli, photo, no_model_load, arguments, message):
    command, *options = arguments
    result = cli(command, photo, *RANDOM_CPU, *options)  # the last --weights counts
    # CliRunner shows Typer's boxed error; the words inside the box are the one line `vitcli` prints.
    words = " ".join(re.sub(r"[│╭╮╰╯─]|Error", " ", result.stderr).split())
    assert result.exit_code == 2 and message in words, result.stderr
    assert "Value error" not in words and "'map'," not in words


def test_a_misspelt_choice_is_one_line_from_the_installed_command(tmp_path):
    usage = run_vitcli("explain", "photo.jpg", "--method", "gradcm", cwd=tmp_path)
    assert usage.returncode == 2 and usage.stderr.count("\n") == 1, usage.stderr
    assert usage.stderr.startswith("error: Invalid value for '--method' / '-M': 'gradcm' is not one of relevance, ")
    assert "(did you mean gradcam?)" in usage.stderr and "Value error" not in usage.stderr


# ----- the installed entry point, as a real subprocess


def test_installed_entry_point_reports_parse_errors_in_one_line(tmp_path):
    usage = run_vitcli("predict", "--top-k", "two", cwd=tmp_path)
    assert usage.returncode == 2
    assert usage.stderr.count("\n") == 1 and "Invalid value for '--top-k'" in usage.stderr


@pytest.mark.slow
def test_installed_entry_point_predicts(photo, tmp_path):
    result = run_vitcli("predict", str(photo), *RANDOM_CPU, "--format", "json", "--top-k", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (document,) = json.loads(result.stdout)["results"]
    assert len(document["result"]["top"]) == 2 and document["subject"]["path"] == str(photo)
    assert list(tmp_path.glob(f"outputs/{MODEL}-random-s0/{photo.stem}-*/predict-k2.json"))


START_UP_PROBE = """
import gc, sys
import vitcli.context
from vitcli.cli import main

load = vitcli.context.CommandContext.model
collections = []
gc.callbacks.append(lambda phase, info: collections.append(info["generation"]) if phase == "start" else None)

def model(self):
    loaded = load(self)
    print(f"collections during start-up={len(collections)} collecting={gc.isenabled()}", file=sys.stderr)
    return loaded

vitcli.context.CommandContext.model = model
sys.argv = ["vitcli", *sys.argv[1:]]
main()
"""


@pytest.mark.slow
def test_console_script_sets_up_the_process_before_importing_torch(photo, tmp_path):
    """The imports of torch and timm and the model's loading run without a collection of the cyclic collector, which
    stays on and settles itself later (see vitcli/collector.py and the next test)."""
    result = subprocess.run(
        [sys.executable, "-c", START_UP_PROBE, "predict", str(photo), *RANDOM_CPU, "-q"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "collections during start-up=0 collecting=True" in result.stderr


SETTLING_PROBE = """
import gc, weakref
from vitcli import collector

python_thresholds = gc.get_threshold()
collector.pause()
start_up = [[] for _ in range(collector.START_UP_ALLOCATIONS // 2)]
held_back = gc.get_count()[0] >= len(start_up) and gc.get_freeze_count() == 0
more = [[] for _ in range(collector.START_UP_ALLOCATIONS)]
settled = gc.get_freeze_count() >= len(start_up) and gc.get_threshold() == python_thresholds

class Node:
    pass

cycle = Node()
cycle.self = cycle
garbage = weakref.ref(cycle)
del cycle
churn = [[] for _ in range(10 * python_thresholds[0])]
print(held_back, settled, garbage() is None)
"""


def test_the_collector_settles_itself_after_start_up():
    """No call ends start-up: once more objects than start-up builds exist, the first collection freezes them all,
    Python's thresholds come back, and cyclic garbage made afterwards is freed as usual."""
    result = subprocess.run([sys.executable, "-c", SETTLING_PROBE], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "True"]


TEARDOWN_PROBE = """
import atexit, sys
from vitcli.cli import main

left_open = open("left-open.txt", "w")
left_open.write("written at teardown")  # buffered: only the interpreter's teardown would write it
atexit.register(print, "exit handlers ran")  # stdout is a pipe: buffered until something flushes it
if sys.argv[1] == "traced":
    sys.settrace(lambda *args: None)
sys.argv = ["vitcli", *sys.argv[2:]]
main()
"""


@pytest.mark.parametrize(("args", "status"), [(("--help",), 0), (("predict", "--top-k", "two"), 2)])
def test_the_console_script_exits_without_the_interpreter_teardown(tmp_path, args, status):
    """Freeing what start-up built, object by object, took about 0.2 s of every command, so the console script ends
    the process once exit handlers have run and stdout and stderr are flushed (vitcli.shell.end_process): a file that
    other code left open keeps its unwritten buffer (vitcli's output store closes and syncs its files first). Under a
    tracer or a profiler, which write their results at exit, the interpreter tears down as usual."""

    def probe(mode: str) -> tuple[subprocess.CompletedProcess, str]:
        folder = tmp_path / mode
        folder.mkdir()
        command = [sys.executable, "-c", TEARDOWN_PROBE, mode, *args]
        buffered = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
        finished = subprocess.run(command, capture_output=True, text=True, cwd=folder, env=buffered, timeout=120)
        return finished, (folder / "left-open.txt").read_text()

    (untraced, untraced_file), (traced, traced_file) = probe("untraced"), probe("traced")
    assert untraced.returncode == traced.returncode == status
    assert untraced.stdout == traced.stdout and untraced.stdout.endswith("exit handlers ran\n")
    assert ("Usage: vitcli" in untraced.stdout) == (status == 0)
    assert untraced.stderr == traced.stderr
    assert (untraced_file, traced_file) == ("", "written at teardown")


THREAD_PROBE = """
import sys, threading, time
from pathlib import Path
from vitcli.cli import main

def finish():
    time.sleep(0.5)
    Path("finished.txt").write_text("the thread's last step")

threading.Thread(target=finish, daemon=sys.argv[1] == "daemon").start()
sys.argv = ["vitcli", "--help"]
main()
"""


@pytest.mark.parametrize("kind", ["non-daemon", "daemon"])
def test_the_console_script_waits_for_a_live_non_daemon_thread(tmp_path, kind):
    """Skipping the teardown would kill a non-daemon thread that other code started mid-work; with one alive the
    process exits as Python does, which waits for it. A daemon thread does not hold the exit back."""
    finished = subprocess.run(
        [sys.executable, "-c", THREAD_PROBE, kind], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert finished.returncode == 0, finished.stderr
    assert "Usage: vitcli" in finished.stdout
    assert (tmp_path / "finished.txt").exists() == (kind == "non-daemon")


def test_library_callers_keep_their_collector(vit):
    """Only the console script holds the collector back: importing vitcli and loading a model leave it as it was."""
    import gc

    import vitcli.cli  # noqa: F401  (everything the console script imports)

    assert gc.isenabled() and gc.get_threshold()[0] < 10_000
    assert not any(getattr(callback, "__module__", "") == "vitcli.collector" for callback in gc.callbacks)


def write_hf_cache(home: Path, state: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = home / "hub" / f"models--timm--{MODEL}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    save_file(state, snapshot / "model.safetensors")


@pytest.mark.slow
def test_pretrained_weights_from_the_hugging_face_cache_are_named_as_such(vit, photo, tmp_path):
    torch.manual_seed(123)
    state = {name: torch.randn_like(tensor) * 0.02 for name, tensor in vit.net.state_dict().items()}
    write_hf_cache(tmp_path / "hf", state)
    result = run_vitcli(
        "predict", str(photo), "--device", "cpu", "--format", "csv", cwd=tmp_path, HF_HOME=str(tmp_path / "hf")
    )
    assert result.returncode == 0, result.stderr
    assert "RANDOM" not in result.stdout
    (json_file,) = tmp_path.glob(f"outputs/{MODEL}/{photo.stem}-*/predict-k5.json")
    provenance = json.loads(json_file.read_text())["provenance"]
    assert provenance["weights"]["source"] == "pretrained"
    from vitcli.model import state_dict_sha256

    assert provenance["parameters_sha256"] == state_dict_sha256(state)


# ----- tests/BAD_INPUTS.md


def test_the_cli_rows_of_bad_inputs_md_name_tests_that_exist():
    """The CLI-level table (four columns: input, message, exit code, test) names a test function in this folder."""
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in BAD_INPUTS_MD.read_text(encoding="utf-8").splitlines()
        if line.startswith("|")
    ]
    cli_rows = [row for row in rows if len(row) == 4 and row[2].isdigit()]
    assert len(cli_rows) >= 10
    for _, message, code, test in cli_rows:
        module, function = re.fullmatch(r"`(test_\w+)\.py::(test_\w+)`", test).groups()
        source = Path(__file__).with_name(f"{module}.py").read_text(encoding="utf-8")
        assert f"def {function}(" in source, test
        assert int(code) in (0, 1, 2, 141, 143), code
        assert re.findall(r"`([^`]+)`", message) or message.startswith("nothing"), message
