"""Where each command's job builder lives: one explicit table, its modules imported on first use.

A command module registers `function(**options) -> list[Job]` with `vitcli.jobs.builds_jobs`. The Python API and
`vitcli run` configs find a command's builder through this table, so they need no import for its side effect (as
importing `vitcli.cli`, which imports every command, was) and import only the one module they use. A new command
adds its line here; tests/test_architecture.py checks the table against what `vitcli.cli` registers.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from vitcli.jobs import JOB_BUILDERS

if TYPE_CHECKING:
    from vitcli.jobs import Job

# Command -> the module whose `@builds_jobs(command)` builder makes its Jobs (and that declares its options).
JOB_MODULES = {
    "ablate": "vitcli.commands.ablate",
    "anatomy": "vitcli.commands.anatomy",
    "attend": "vitcli.commands.attend",
    "attribute": "vitcli.commands.attribute",
    "compare-patch-size": "vitcli.commands.compare_patch_size",
    "explain": "vitcli.commands.explain",
    "explore": "vitcli.commands.explore",
    "heads": "vitcli.commands.heads",
    "lens": "vitcli.commands.lens",
    "occlude-patches": "vitcli.commands.occlude",
    "occlude-quadrants": "vitcli.commands.occlude",
    "patch": "vitcli.commands.patch",
    "patches": "vitcli.commands.patches",
    "predict": "vitcli.commands.predict",
    "trace": "vitcli.commands.trace",
}


def job_commands() -> list[str]:
    """The commands whose Jobs the API and `vitcli run` can build, sorted."""
    return sorted(JOB_MODULES)


def import_command(command: str) -> None:
    """Import the module that defines `command` (its builder and its options), if it has one in the table."""
    if command in JOB_MODULES:
        importlib.import_module(JOB_MODULES[command])


def job_builder(command: str) -> Callable[..., list[Job]]:
    """The builder registered for `command` (a key of JOB_MODULES)."""
    import_command(command)
    return JOB_BUILDERS[command]
