"""The `vitcli` entry point: the Typer app with every command registered, in the order `vitcli --help` lists them."""

# Registration order is the order of --help: the lecture's steps first, batch runs last.
# isort: off
from vitcli.commands import predict, patches, attend, occlude, compare_patch_size  # noqa: F401
from vitcli.commands import trace, compare, explain, lens, probe, explore  # noqa: F401
from vitcli.commands import attribute, ablate, patch, anatomy, heads  # noqa: F401
from vitcli.commands import scenes, bench, batch, report  # noqa: F401

# isort: on
from vitcli.shell import app, run

__all__ = ["app", "main"]


def main() -> None:
    run()
