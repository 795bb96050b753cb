"""examples/tour.ipynb runs top to bottom in a fresh kernel (nbclient), and every result it computed equals the JSON
the command of the same name writes for the same photo and options (the provenance's command line aside).

The oracle is the CLI's own file, written in this process from the same relative photo path the notebook uses.
Broken on purpose once: the notebook's attend cell with query=75 made the attend comparison fail.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from conftest import RANDOM_CPU, result_files

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NOTEBOOK = EXAMPLES / "tour.ipynb"
# The notebook's variables and the command line that computes the same result.
SAME_AS = {
    "prediction": ["predict", "--top-k", "5"],
    "patch": ["patches", "--patch", "63"],
    "attention": ["attend", "--block", "4", "--head", "1", "--query", "74"],
    "rollout": ["attend", "--view", "rollout", "--query", "cls"],
    "quadrants": ["occlude-quadrants"],
    "windows": ["occlude-patches"],
    "lens": ["lens"],
    "trace": ["trace", "--token", "0,74", "--blocks", "1,12"],
    "explanation": ["explain", "--method", "relevance", "--method", "gradcam", "--method", "rollout"],
    "explore": ["explore", "--blocks", "1-4"],
}
DUMP = (
    "import json as _json\n"
    "print(_json.dumps({name: value.to_dict() for name, value in globals().items() "
    "if isinstance(value, vitcli.Result)}))"
)


def comparable(document: dict) -> dict:
    document = json.loads(json.dumps(document))
    document["provenance"].pop("command")
    return document


@pytest.mark.slow
def test_tour_notebook_runs_and_equals_the_commands_json(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    from typer.testing import CliRunner

    from vitcli.cli import app

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell(DUMP))
    started = time.perf_counter()
    nbclient.NotebookClient(notebook, timeout=600, resources={"metadata": {"path": str(EXAMPLES)}}).execute()
    print(f"\nexamples/tour.ipynb ran in {time.perf_counter() - started:.1f} s")
    errors = [output for cell in notebook.cells for output in cell.get("outputs", []) if output.output_type == "error"]
    assert errors == []
    assert stderr_outputs(notebook) == []
    (stream,) = [output for output in notebook.cells[-1].outputs if output.output_type == "stream"]
    computed = json.loads(stream.text)
    assert set(computed) == set(SAME_AS)

    monkeypatch.chdir(EXAMPLES)  # the notebook's relative photo path, so the subjects' paths agree too
    runner = CliRunner()
    for name, arguments in SAME_AS.items():
        command, *options = arguments
        out = tmp_path / name
        result = runner.invoke(
            app, [command, "images/newfoundland_31.jpg", *options, *RANDOM_CPU, "-o", str(out), "-q"]
        )
        assert result.exit_code == 0, (name, result.stderr)
        files = result_files(out, computed[name]["experiment"]["name"])
        assert comparable(computed[name]) == comparable(json.loads(files["json"].read_text())), name


def stderr_outputs(notebook) -> list[str]:
    """What the cells wrote on stderr (warnings, progress bars): a reader's copy of the outputs should have none."""
    return [out.text for cell in notebook.cells for out in cell.get("outputs", []) if out.get("name") == "stderr"]


@pytest.mark.slow
def test_the_set_up_and_explorer_cells_write_nothing_on_stderr():
    """The cells that import the hub client (tqdm's widget warning without ipywidgets) and show the explorer page
    (IPython's warning for an HTML object that is an iframe). Seen to fail with both warnings."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    explorer = next(index for index, cell in enumerate(notebook.cells) if "explorer_fragment" in cell.source)
    notebook.cells = [notebook.cells[1], notebook.cells[explorer]]
    nbclient.NotebookClient(notebook, timeout=600, resources={"metadata": {"path": str(EXAMPLES)}}).execute()
    assert stderr_outputs(notebook) == []
    (shown,) = [out for out in notebook.cells[1].outputs if "text/html" in out.get("data", {})]
    assert shown.data["text/html"].startswith('<iframe class="explorer"')
