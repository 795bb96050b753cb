"""--no-figures and a config's `[output] figures = false`: results are written whole without their PNG, and the
command line overrides the config."""

from __future__ import annotations

import json

from conftest import RANDOM_CPU


def _files(root) -> set[str]:
    return {path.name for path in root.rglob("predict-k5.*")}


def _indexed(root) -> set[str]:
    (index,) = root.rglob("index.json")
    return set(json.loads(index.read_text())["results"]["predict-k5"]["files"])


def test_no_figures_writes_json_and_csv_and_indexes_only_them(cli, workdir, photo):
    """Seen failing with the Publisher ignoring the flag (the PNG was written and indexed)."""
    result = cli("predict", photo, *RANDOM_CPU, "--no-figures", "--quiet")
    assert result.exit_code == 0, result.stderr
    assert _files(workdir / "outputs") == {"predict-k5.json", "predict-k5.csv"}
    assert _indexed(workdir / "outputs") == {"predict-k5.json", "predict-k5.csv"}
    again = cli("predict", photo, *RANDOM_CPU, "--quiet")
    assert again.exit_code == 0, again.stderr
    assert _indexed(workdir / "outputs") == {"predict-k5.json", "predict-k5.csv", "predict-k5.png"}


def test_a_config_without_figures_and_the_command_line_overriding_it(cli, workdir, photo):
    """Seen failing with `[output] figures` read but not passed to the run's context."""
    config = workdir / "nofig.toml"
    config.write_text(
        f'images = ["{photo}"]\n[model]\nweights = "random"\ndevice = "cpu"\n[output]\nfigures = false\n'
        '[[experiments]]\ncommand = "predict"\n',
        encoding="utf-8",
    )
    result = cli("run", config, "--quiet")
    assert result.exit_code == 0, result.stderr
    assert _files(workdir / "outputs" / "nofig") == {"predict-k5.json", "predict-k5.csv"}
    manifest = json.loads((workdir / "outputs" / "nofig" / "manifest.json").read_text())
    assert manifest["config"]["figures"] is False
    forced = cli("run", config, "--figures", "--force", "--quiet")
    assert forced.exit_code == 0, forced.stderr
    assert "predict-k5.png" in _files(workdir / "outputs" / "nofig")


def test_figures_must_be_a_boolean_in_a_config(cli, workdir, photo):
    config = workdir / "bad.toml"
    config.write_text(
        f'images = ["{photo}"]\n[output]\nfigures = "no"\n[[experiments]]\ncommand = "predict"\n', encoding="utf-8"
    )
    result = cli("run", config, *RANDOM_CPU)
    assert result.exit_code == 2
    assert "output.figures: must be true or false" in result.stderr
