from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vitcli.context import CommandContext
from vitcli.shell import vitcli_command

MAX_ROWS = 100  # CSV rows per result: keeps each image's page small


@vitcli_command(
    "report",
    options=("quiet", "debug"),
    examples=[
        "vitcli report outputs/lecture",
        "vitcli report outputs/sweep --rows 10",
        "vitcli report outputs/sweep --pages",
    ],
)
def report_command(
    context: CommandContext,
    run_dir: Annotated[
        Path, typer.Argument(metavar="RUN_DIR", help="The folder of a `vitcli run` (OUTPUT/NAME), shards included.")
    ],
    rows: Annotated[int, typer.Option("--rows", min=1, max=MAX_ROWS, help="CSV rows shown beside each figure.")] = 5,
    single_file: Annotated[
        bool | None,
        typer.Option(
            "--single-file/--pages",
            help="One self-contained page with every figure and explorer embedded (runs of up to 40 images and 50 MB "
            "of figures and explorer pages), or an index page beside one page per image. Default: by the run's size.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """HTML pages for a run: provenance, the summary table, timings, failures, and per image every result's figure
    beside its headline numbers and a few CSV rows, explain's audit tables, and the attention explorer where the run
    computed one. Small runs get one self-contained page; larger ones an index (sortable, paginated) beside one page
    per image in its result folder. Nothing is loaded from the network. Opens at RUN_DIR/report.html; no model is
    loaded.
    """
    from vitcli.report.layouts import write_report

    context.messages.info(f"wrote {write_report(run_dir, rows, single_file)}")
