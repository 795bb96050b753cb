"""Where each command's job builder lives: one explicit table, its modules imported on first use.

A module of vitcli.jobs registers `function(**options) -> list[Job]` with `vitcli.jobs.builds_jobs`. The Python API and
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

# Command -> the module whose `@builds_jobs(command)` builder makes its Jobs.
JOB_MODULES = {
    "ablate": "vitcli.jobs.ablate",
    "anatomy": "vitcli.jobs.anatomy",
    "attend": "vitcli.jobs.attend",
    "attribute": "vitcli.jobs.attribute",
    "bench": "vitcli.jobs.bench",
    "compare": "vitcli.jobs.compare",
    "compare-patch-size": "vitcli.jobs.compare_patch_size",
    "explain": "vitcli.jobs.explain",
    "explore": "vitcli.jobs.explore",
    "heads": "vitcli.jobs.heads",
    "lens": "vitcli.jobs.lens",
    "occlude-patches": "vitcli.jobs.occlude",
    "occlude-quadrants": "vitcli.jobs.occlude",
    "patch": "vitcli.jobs.patch",
    "patches": "vitcli.jobs.patches",
    "probe": "vitcli.jobs.probe",
    "predict": "vitcli.jobs.predict",
    "trace": "vitcli.jobs.trace",
}


def job_commands() -> list[str]:
    """The commands whose Jobs the API and `vitcli run` can build, sorted."""
    return sorted(JOB_MODULES)


def job_builder(command: str) -> Callable[..., list[Job]]:
    """The builder registered for `command` (a key of JOB_MODULES)."""
    importlib.import_module(JOB_MODULES[command])
    return JOB_BUILDERS[command]
