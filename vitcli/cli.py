"""The `vitcli` entry point: the Typer app with every command registered."""

from vitcli.commands import (  # noqa: F401  (registers)
    attend,
    batch,
    compare,
    compare_patch_size,
    explain,
    lens,
    occlude,
    patches,
    predict,
    probe,
    report,
    trace,
)
from vitcli.shell import app, run

__all__ = ["app", "main"]


def main() -> None:
    run()
