"""`vitcli patch`: the Typer command and its options; its Jobs and their builder are vitcli.jobs.patch."""

from __future__ import annotations

from typing import Annotated

import typer

from vitcli.commands.target_options import (
    ContrastTextOption,
    TargetDirectionOption,
    TargetFeatureOption,
    TargetImageOption,
    TargetOption,
    TargetTextOption,
)
from vitcli.context import CommandContext
from vitcli.jobs.patch import Method, SiteKind, clean_and_corrupt, patch_pair_job
from vitcli.shell import vitcli_command

PairArgument = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="CLEAN CORRUPT",
        help="Two image files: CLEAN (whose activations are put back), then CORRUPT (the run that is patched).",
        show_default=False,
    ),
]


@vitcli_command(
    "patch",
    examples=[
        "vitcli patch examples/images/newfoundland_31.jpg examples/images/Persian_98.jpg",
        "vitcli patch examples/images/newfoundland_31.jpg examples/images/Persian_98.jpg --sites heads "
        "--method activation --method attribution",
        "vitcli patch dog.jpg cat.jpg --target 256 --contrast 283 --sites attention --sites mlp --format json",
    ],
)
def patch_command(
    context: CommandContext,
    images: PairArgument = None,
    target: TargetOption = None,
    contrast: Annotated[
        str | None,
        typer.Option(
            "--contrast",
            help="The class subtracted in M = logit(target) - logit(contrast): an index or a label. Default: "
            "CORRUPT's top-1, or its second when that is the target.",
            show_default=False,
        ),
    ] = None,
    sites: Annotated[
        list[SiteKind] | None,
        typer.Option(
            "--sites",
            "-s",
            help="Where to patch, repeatable: residual (one row entering a block; blocks x tokens forwards), "
            "attention, mlp (a block's output), heads (one head's slice of attn.proj's input). Default: all four.",
            show_default=False,
        ),
    ] = None,
    method: Annotated[
        list[Method] | None,
        typer.Option(
            "--method",
            help="activation: one patched forward per site; attribution: the first-order estimate "
            "(a_clean - a_corrupt) . dM/da from 2 forwards and 1 backward. Repeat for both (and their correlation). "
            "Default: activation.",
            show_default=False,
        ),
    ] = None,
    target_image: TargetImageOption = None,
    target_direction: TargetDirectionOption = None,
    target_feature: TargetFeatureOption = None,
    target_text: TargetTextOption = None,
    contrast_text: ContrastTextOption = None,
) -> None:
    """Activation patching: run CORRUPT, put back CLEAN's activation at one site (residual row, attention or MLP
    output, head), and score how much of M = logit(target) - logit(contrast) it restores."""
    from vitcli.runner import LineSteps, ProgressSteps, Report, progress_display

    pair_job = patch_pair_job(
        images,
        target,
        contrast,
        sites,
        method,
        target_image,
        target_direction,
        target_feature,
        target_text,
        contrast_text,
    )
    clean_path, corrupt_path = clean_and_corrupt(images)
    (job,) = context.plan([pair_job])
    model = context.model()
    with progress_display(context.show_progress(1)) as progress:
        steps = ProgressSteps(progress) if progress is not None else LineSteps(context.messages.info)
        # One result about the pair: a failure ends the command with its own message.
        context.session(model, reraise=True).run([job], [clean_path, corrupt_path], Report(), progress, steps)
    context.emitter.finish()
