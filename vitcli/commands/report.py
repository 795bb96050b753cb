from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vitcli import collector
from vitcli.context import CommandContext
from vitcli.shell import vitcli_command


@vitcli_command(
    "report",
    options=("quiet", "debug"),
    examples=[
        "vitcli report outputs/lecture",
        "vitcli report outputs/sweep --rows 10",
    ],
)
def report_command(
    context: CommandContext,
    run_dir: Annotated[
        Path, typer.Argument(metavar="RUN_DIR", help="The folder of a `vitcli run` (OUTPUT/NAME), shards included.")
    ],
    rows: Annotated[int, typer.Option("--rows", min=1, help="CSV rows shown beside each figure.")] = 5,
) -> None:
    """One self-contained HTML page for a run: provenance, the summary table, and per image every result's figure
    beside its headline numbers and a few CSV rows. Figures are embedded; the page needs no network. Written to
    RUN_DIR/report.html; no model is loaded.
    """
    from vitcli.batch.report import write_report

    collector.settle()
    context.messages.info(f"wrote {write_report(run_dir, rows)}")
