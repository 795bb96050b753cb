"""`vitcli anatomy`: the Typer command and its options; its Jobs and their builder are vitcli.jobs.anatomy."""

from __future__ import annotations

from typing import Annotated

import typer

from vitcli.context import CommandContext
from vitcli.errors import AlreadyReported
from vitcli.jobs.anatomy import (
    DEFAULT_CKA_MINIBATCH,
    DEFAULT_NORM_FACTOR,
    DEFAULT_PCA_THRESHOLD,
    MAX_CKA_MINIBATCH,
    MIN_CKA_IMAGES,
    View,
    anatomy_jobs,
    check_image_count,
)
from vitcli.shell import vitcli_command


@vitcli_command(
    "anatomy",
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
    view: Annotated[
        list[View] | None,
        typer.Option(
            "--view",
            help="Repeatable. filters: principal components of the patch-embedding filters; positions: cosine "
            "similarity of the position embeddings; distance: mean attention distance per head; cka: linear CKA "
            "between blocks; pca: the last block's patch features to RGB; norms: high-norm tokens. Default: all "
            "with images, else filters and positions.",
            show_default=False,
        ),
    ] = None,
    norm_factor: Annotated[
        float,
        typer.Option("--norm-factor", help="norms: list tokens whose norm exceeds this many times the block's median."),
    ] = DEFAULT_NORM_FACTOR,
    pca_threshold: Annotated[
        float,
        typer.Option(
            "--pca-threshold",
            help="pca: patches whose first principal component (min-max scaled over the images, 0 to 1) exceeds "
            "this are foreground.",
        ),
    ] = DEFAULT_PCA_THRESHOLD,
    cka_minibatch: Annotated[
        int,
        typer.Option(
            "--cka-minibatch",
            help=f"cka: images per minibatch of the unbiased HSIC estimator ({MIN_CKA_IMAGES} to {MAX_CKA_MINIBATCH}; "
            "memory holds Gram matrices of this size, not activations).",
        ),
    ] = DEFAULT_CKA_MINIBATCH,
) -> None:
    """What a ViT learned about space: patch filters, position-embedding similarity, mean attention distance, CKA
    between blocks, PCA of patch features to RGB and high-norm tokens (the ViT paper's Figure 7, Raghu et al.,
    DINO, Darcet et al.)."""
    from vitcli.runner import Report, progress_display

    jobs = context.plan(anatomy_jobs(view, norm_factor, pca_threshold, cka_minibatch, with_images=bool(images)))
    paths = context.images(images) if images else []
    check_image_count([job.view for job in jobs], len(paths))  # type: ignore[attr-defined]
    model = context.model()
    report = Report()
    with progress_display(context.show_progress(len(paths))) as progress:
        context.session(model).run(jobs, paths, report, progress)
    context.emitter.finish()
    if report.failures:
        raise AlreadyReported("")
