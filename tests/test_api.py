"""The Python API (vitcli.load_model, vitcli.attend, ...) against the CLI's own files for the same image and options,
its typed errors, its light import; and the program run as `python -m vitcli` and `vitcli --version`.

The oracle for every result is the file the command writes: the API must produce the same JSON (provenance's
command line aside) and the same CSV rows. Broken on purpose once: publishing without the image's subject JSON failed
test_api_equals_the_commands_json_and_csv for every command.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import matplotlib.pyplot as plt
import pandas
import pytest
from test_entry_point import run_vitcli

import vitcli
from vitcli.errors import UsageError, VitcliError

from conftest import RANDOM_CPU, result_files

MODEL = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"

CASES = [
    ("attend", {"block": 4, "head": 1, "query": 74}, ["--block", "4", "--head", "1", "--query", "74"]),
    ("predict", {"top_k": 3}, ["--top-k", "3"]),
    ("patches", {"patch": [63, "r5c3"]}, ["--patch", "63", "--patch", "r5c3"]),
    ("lens", {}, []),
    ("attribute", {"by": "head"}, ["--by", "head"]),
    ("ablate", {"heads": "1.1,12.3"}, ["--heads", "1.1,12.3"]),
    pytest.param("occlude-quadrants", {"fill": "black"}, ["--fill", "black"], marks=pytest.mark.slow),
    pytest.param(
        "trace", {"token": "0,74", "blocks": "1,12"}, ["--token", "0,74", "--blocks", "1,12"], marks=pytest.mark.slow
    ),
]


@pytest.fixture(scope="module")
def model():
    return vitcli.load_model(weights="random", device="cpu")


def without_command_line(document: dict) -> dict:
    document = json.loads(json.dumps(document))
    document["provenance"].pop("command")
    return document


@pytest.mark.parametrize(("command", "options", "arguments"), CASES)
def test_api_equals_the_commands_json_and_csv(model, cli, workdir, newfoundland, command, options, arguments):
    result = getattr(vitcli, command.replace("-", "_"))(model, newfoundland, **options)
    assert isinstance(result, vitcli.Result)
    written = cli(command, newfoundland, *RANDOM_CPU, *arguments, "--quiet")
    assert written.exit_code == 0, written.stderr
    files = result_files(workdir / "outputs", result.name)
    assert without_command_line(result.to_dict()) == without_command_line(json.loads(files["json"].read_text()))
    assert result.to_dict()["provenance"]["command"].startswith(f"vitcli.{command.replace('-', '_')}(model, ")
    pandas.testing.assert_frame_equal(result.to_frame(), pandas.read_csv(files["csv"]), check_dtype=False)
    if "png" in files:
        figure = result.figure()
        assert figure.axes
        plt.close(figure)


def test_to_frame_keeps_grid_positions_and_indices_whole(model, newfoundland):
    """The CLS row has no grid position, yet `row` and `col` stay whole numbers (pandas' nullable integers)."""
    frame = vitcli.attend(model, newfoundland, block=4, head=1, query=74).to_frame()
    for column in ("row", "col", "token"):
        assert pandas.api.types.is_integer_dtype(frame[column]), (column, frame[column].dtype)
    cls = frame["token"] == 0
    assert frame.loc[cls, "row"].isna().all() and frame.loc[~cls, "row"].notna().all()
    assert sorted(zip(frame.loc[~cls, "row"], frame.loc[~cls, "col"], strict=True)) == [
        (row, col) for row in range(14) for col in range(14)
    ]
    trace = vitcli.trace(model, newfoundland).to_frame()
    assert pandas.api.types.is_integer_dtype(trace["block"]) and pandas.api.types.is_integer_dtype(trace["head"])


def test_explore_page(model, photo):
    result = vitcli.explore(model, photo, blocks="2")
    assert result.name == "explore-b2" and "<!DOCTYPE html>" in result.text("html")
    assert result.to_dict()["result"]["blocks"] == [2]
    with pytest.raises(VitcliError, match="draws no figure"):
        result.figure()


def test_the_api_runs_the_commands_jobs(model, photo, monkeypatch):
    """Not a second path: the API builds its jobs with the command's registered builder."""
    from vitcli.jobs import JOB_BUILDERS

    built = []
    original = JOB_BUILDERS["attend"]

    @functools.wraps(original)
    def spy(**options):
        built.append(options)
        return original(**options)

    monkeypatch.setitem(JOB_BUILDERS, "attend", spy)
    vitcli.attend(model, photo, block=1, head=2, query="cls")
    assert built == [{"block": 1, "head": 2, "query": "cls"}]


@pytest.mark.parametrize(
    ("call", "error", "message", "code"),
    [
        (lambda m, p: vitcli.attend(m, p, block=13, head=1), UsageError, "--block must be between 1 and 12", 2),
        (lambda m, p: vitcli.attend(m, p, view="heat"), UsageError, "view: Invalid value for '--view'", 2),
        (lambda m, p: vitcli.attend(m, p, colour="red"), UsageError, "`attend` has no option 'colour'", 2),
        (lambda m, p: vitcli.predict(m, p, top_k=0), UsageError, "--top-k must be between 1 and 1000", 2),
        (lambda m, p: vitcli.explore(m, p, blocks="0"), UsageError, "--blocks 0: blocks run from 1 to 12", 2),
        (lambda m, p: vitcli.predict(m, p.with_name("missing.jpg")), VitcliError, "no such file or directory", 1),
        (lambda m, p: vitcli.load_model(weights="trained"), UsageError, "weights must be 'pretrained' or 'random'", 2),
        (lambda m, p: vitcli.run_experiment("dance", m, p), UsageError, "'dance' is not an experiment", 2),
    ],
)
def test_errors_are_typed_never_system_exit(model, photo, call, error, message, code):
    with pytest.raises(error, match=message) as raised:
        call(model, photo)
    assert raised.value.exit_code == code


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m, p: vitcli.predict(m, p, top_k="x"), "top_k: Invalid value for '--top-k'"),
        (lambda m, p: vitcli.predict(m, p, top_k=3.5), "top_k: 3.5 is not an integer"),
        (lambda m, p: vitcli.predict(m, 123), "image must be the path of an image file (a str or pathlib.Path)"),
        (lambda m, p: vitcli.predict(m.name, p), f"not the name '{MODEL}': pass vitcli.load_model('{MODEL}')"),
        (lambda m, p: vitcli.predict(object(), p), "model must be a loaded model from vitcli.load_model"),
        (lambda m, p: vitcli.ablate(m, p, heads="\u00b2.1"), "--heads '\u00b2.1': write heads as BLOCK.HEAD (4.2)"),
        (lambda m, p: vitcli.ablate(m, p, blocks="\u00b2.attn"), "--blocks '\u00b2.attn': write sublayers as"),
        (lambda m, p: vitcli.attend(m, p, block=4, head=1, query=True), "query: True is not a value this option"),
        (lambda m, p: vitcli.attend(m, p, block=True, head=1), "block: True is not a value this option takes"),
        (lambda m, p: vitcli.attend(m, p, all_heads="yes", block=4), "all_heads: 'yes' is not true or false"),
        (lambda m, p: vitcli.run_experiment(["predict"], m, p), "['predict'] is not an experiment"),
        (
            lambda m, p: vitcli.load_model(weights="random", batch_size=0),
            "batch_size: Invalid value for '--batch-size'",
        ),
        (
            lambda m, p: vitcli.load_model(weights="random", batch_size=-3),
            "batch_size: Invalid value for '--batch-size'",
        ),
        (lambda m, p: vitcli.load_model(weights="random", batch_size=True), "batch_size: True is not a value"),
        (lambda m, p: vitcli.load_model(weights="random", seed="x"), "seed: Invalid value for '--seed'"),
        (lambda m, p: vitcli.load_model(m, weights="random"), "name must be a timm model name such as"),
    ],
)
def test_arguments_of_the_wrong_type_are_usage_errors_with_the_command_lines_message(model, photo, call, message):
    """Issue 27 item 15: these raised TypeError, AttributeError or ValueError, or (batch_size=0) were accepted."""
    with pytest.raises(UsageError) as raised:
        call(model, photo)
    assert message in str(raised.value) and raised.value.exit_code == 2, str(raised.value)
    assert "\n" not in str(raised.value) and "Error" not in str(raised.value)


def test_text_where_the_command_line_takes_a_number_is_read_as_the_command_line_reads_it(model, photo):
    as_text = vitcli.predict(model, photo, top_k="3")
    assert as_text.name == "predict-k3"
    assert without_command_line(as_text.to_dict()) == without_command_line(
        vitcli.predict(model, photo, top_k=3).to_dict()
    )


def test_import_vitcli_stays_light():
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, vitcli; from vitcli import load_model, attend, Result; "
            "print(sorted({'torch', 'timm', 'matplotlib', 'pandas'} & set(sys.modules)))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "[]"


@pytest.mark.slow  # several seconds: `make test` leaves it to CI's full run
def test_version_and_python_dash_m():
    version = run_vitcli("--version")
    assert version.returncode == 0 and version.stdout == f"vitcli {vitcli.__version__}\n"
    module = subprocess.run([sys.executable, "-m", "vitcli", "--version"], capture_output=True, text=True, timeout=120)
    assert module.returncode == 0 and module.stdout == version.stdout
    listing = subprocess.run([sys.executable, "-m", "vitcli", "--help"], capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0 and "explore" in listing.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "vitcli", "explore", "--blocks", "x", "--weights", "random"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("error: --blocks x") and bad.stderr.count("\n") == 1
