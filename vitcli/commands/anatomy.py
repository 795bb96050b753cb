"""`vitcli anatomy`: the Typer command; its options, Jobs and builder are vitcli.jobs.anatomy."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from vitcli.context import CommandContext
from vitcli.errors import AlreadyReported
from vitcli.jobs.anatomy import (
    anatomy_jobs,
    check_image_count,
)
from vitcli.shell import vitcli_command


@vitcli_command(
    "anatomy",
    builder=anatomy_jobs,
    examples=[
        "vitcli anatomy   # filters and positions: the weights alone",
        "vitcli anatomy examples/images   # every view over a folder",
        "vitcli anatomy photos/ --view distance --view cka",
        "vitcli anatomy photos/ --view norms --norm-factor 4",
    ],
)
def anatomy_command(
    context: CommandContext,
    images: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="IMAGE",
            help="Image files, folders or globs for the views that read images (none: only filters and positions).",
            show_default=False,
        ),
    ] = None,
    **options: Any,
) -> None:
    """What a ViT learned about space: patch filters, position-embedding similarity, mean attention distance, CKA
    between blocks, PCA of patch features to RGB and high-norm tokens (the ViT paper's Figure 7, Raghu et al.,
    DINO, Darcet et al.)."""
    from vitcli.runner import Report, progress_display

    jobs = context.plan(anatomy_jobs(**options, with_images=bool(images)))
    paths = context.images(images) if images else []
    check_image_count([job.view for job in jobs], len(paths))  # type: ignore[attr-defined]
    model = context.model()
    report = Report()
    with progress_display(context.show_progress(len(paths))) as progress:
        context.session(model).run(jobs, paths, report, progress)
    context.emitter.finish()
    if report.failures:
        raise AlreadyReported("")
