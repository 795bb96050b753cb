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
from vitcli.jobs.patch import Method, PatchJob, SiteKind, clean_and_corrupt
from vitcli.naming import set_subject
from vitcli.shell import vitcli_command
from vitcli.targets import parse_embedding_target

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
    from vitcli.experiments.patching import patch_images
    from vitcli.runner import LineSteps, ProgressSteps, progress_display

    chosen_sites = [kind.value for kind in (sites or list(SiteKind))]
    chosen_methods = [each.value for each in (method or [Method.activation])]
    clean_path, corrupt_path = clean_and_corrupt(images)
    embedding = parse_embedding_target(
        target, target_image, target_direction, target_feature, contrast, target_text, contrast_text
    )
    job = PatchJob(clean_path, target, contrast, chosen_sites, chosen_methods, embedding)
    context.check([job])
    model = context.model()
    clean, corrupt = model.prepare(clean_path), model.prepare(corrupt_path)
    with progress_display(context.show_progress(1)) as progress:
        steps = ProgressSteps(progress) if progress is not None else LineSteps(context.messages.info)
        result = patch_images(
            model,
            clean,
            corrupt,
            job.sites,
            job.methods,
            job.target,
            job.contrast,
            steps,
            embedding=job.bound_target(model),
        )
    subject = {"clean": clean.source.to_json(), "corrupt": corrupt.source.to_json()}
    context.publish([(job, result, set_subject([clean_path, corrupt_path]), subject)], context.provenance(model))
