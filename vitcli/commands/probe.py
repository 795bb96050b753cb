"""`vitcli probe`: the Typer command; its options, its Job (which keeps the features and the checkpoint
in the output store) and builder are vitcli.jobs.probe."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from vitcli.context import CommandContext
from vitcli.jobs.probe import ProbeJob, probe_jobs
from vitcli.shell import vitcli_command


@vitcli_command(
    "probe",
    builder=probe_jobs,
    examples=[
        "vitcli probe pets/   # pets/dog/*.jpg, pets/cat/*.jpg",
        "vitcli probe pets/ --val-fraction 0.3 --split-seed 1 --weight-decay 1e-3",
    ],
)
def probe_command(
    context: CommandContext,
    data_dir: Annotated[
        Path,
        typer.Argument(metavar="DATA_DIR", help="An ImageFolder: one subfolder of images per class (dog/, cat/)."),
    ],
    **options: Any,
) -> None:
    """A linear probe: new classes on the frozen model's features (logistic regression), with a checkpoint that
    `--checkpoint` loads with the new class names."""
    from vitcli.runner import ProgressSteps, Report, progress_display

    (job,) = context.plan([ProbeJob(**options, data_dir=data_dir)])
    folder = job.image_folder  # its refusals come before the model loads
    model = context.model()
    with progress_display(context.show_progress(len(folder.paths))) as progress:
        job.steps = ProgressSteps(progress)
        # One result about the data folder: a failure ends the command with its own message.
        context.session(model, reraise=True).run([job], [], Report(), progress)
    context.emitter.finish()
