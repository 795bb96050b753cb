"""The `vitcli` entry point: the Typer app with every command registered."""

from vitcli.commands import attend, batch, compare_patch_size, occlude, patches, predict  # noqa: F401  (registers)
from vitcli.shell import app, run

__all__ = ["app", "main"]


def main() -> None:
    run()
