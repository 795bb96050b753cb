"""The thin CLI layer: one module per command; each declares the command's options for Typer, builds its Jobs with
the builder in vitcli.jobs and hands them to the runner."""

from __future__ import annotations

import importlib

# Command -> the module that puts it on the Typer app. `vitcli run` configs and the Python API convert an option
# through the click parameter the command line has for it (vitcli.batch.config), so they import that one module,
# not vitcli.cli and every command. tests/test_architecture.py reads this table as import arrows.
COMMAND_MODULES = {
    "ablate": "vitcli.commands.ablate",
    "anatomy": "vitcli.commands.anatomy",
    "attend": "vitcli.commands.attend",
    "attribute": "vitcli.commands.attribute",
    "bench": "vitcli.commands.bench",
    "compare": "vitcli.commands.compare",
    "compare-patch-size": "vitcli.commands.compare_patch_size",
    "explain": "vitcli.commands.explain",
    "explore": "vitcli.commands.explore",
    "heads": "vitcli.commands.heads",
    "lens": "vitcli.commands.lens",
    "occlude-patches": "vitcli.commands.occlude",
    "occlude-quadrants": "vitcli.commands.occlude",
    "patch": "vitcli.commands.patch",
    "patches": "vitcli.commands.patches",
    "probe": "vitcli.commands.probe",
    "predict": "vitcli.commands.predict",
    "trace": "vitcli.commands.trace",
}


def import_command_line(command: str) -> None:
    """Put `command` on the Typer app, whoever imported what before (`run`, not in the table, is there already when
    a config is read)."""
    if command in COMMAND_MODULES:
        importlib.import_module(COMMAND_MODULES[command])
