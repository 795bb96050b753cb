"""`vitcli explain`: the Typer command and its options; its Jobs and their builder are vitcli.jobs.explain."""

from __future__ import annotations

from typing import Annotated

import typer

from vitcli.commands.explain_options import (
    BaselineOption,
    ContrastOption,
    IgStepsOption,
    MasksOption,
    NoiseOption,
    NoiseSeedOption,
    RadiusOption,
    RoadOption,
    RobustnessOption,
    SamplesOption,
    SanityOption,
    SanitySeedOption,
    SanityThresholdOption,
)
from vitcli.commands.target_options import (
    ContrastTextOption,
    TargetDirectionOption,
    TargetFeatureOption,
    TargetImageOption,
    TargetOption,
    TargetTextOption,
)
from vitcli.context import CommandContext
from vitcli.experiments.explain_options import (
    DEFAULT_IG_STEPS,
    DEFAULT_NOISE,
    DEFAULT_RADIUS,
    DEFAULT_SAMPLES,
    DEFAULT_SANITY_THRESHOLD,
)
from vitcli.jobs.explain import DEFAULT_METHODS, DEFAULT_STEPS, Method, explain_jobs
from vitcli.jobs.explain_options import Baseline
from vitcli.jobs.occlude import Fill
from vitcli.options import ImagesArgument
from vitcli.shell import vitcli_command

_FAITHFULNESS = "Faithfulness options"


@vitcli_command(
    "explain",
    examples=[
        "vitcli explain examples/images/newfoundland_31.jpg",
        "vitcli explain photo.jpg --method relevance --method gradcam --method occlusion --faithfulness",
        "vitcli explain photos/ --method gradcam --block 8 --target Newfoundland --format csv",
    ],
)
def explain_command(
    context: CommandContext,
    images: ImagesArgument = None,
    method: Annotated[
        list[Method] | None,
        typer.Option(
            "--method",
            "-M",
            help="relevance (Chefer et al. ICCV 2021), grad-rollout, gradcam (at --block's norm1), attention "
            "(--block's CLS row, heads averaged), rollout, occlusion (one forward per patch), ig (Integrated "
            "Gradients), smoothgrad, gradient (gradient x input), dla (each patch's direct contribution through "
            "every block's attention heads, attribute --by token summed), and two baselines that read no model: random "
            "(uniform per patch, seeded by --noise-seed and the image) and edge (the input's Sobel magnitude); "
            "repeatable. "
            f"Default: {', '.join(DEFAULT_METHODS)}.",
            show_default=False,
        ),
    ] = None,
    target: TargetOption = None,
    block: Annotated[
        int | None,
        typer.Option(
            help="Block (from 1) whose norm1 output gradcam reads and whose attention `attention` shows. "
            "Default: the last.",
            show_default=False,
        ),
    ] = None,
    fill: Annotated[
        Fill,
        typer.Option(help="What covered pixels become (occlusion and --faithfulness), as in the occlusion commands."),
    ] = Fill.gray,
    faithfulness: Annotated[
        bool,
        typer.Option(
            "--faithfulness",
            help="Deletion and insertion curves per map and their AUCs (trapezoidal over the fraction of patches "
            "0..1, unperturbed point included; lower deletion and higher insertion AUC are better).",
            rich_help_panel=_FAITHFULNESS,
        ),
    ] = False,
    steps: Annotated[
        int | None,
        typer.Option(
            help=f"Points after the unperturbed one (default {DEFAULT_STEPS}, at most the patches).",
            show_default=False,
            rich_help_panel=_FAITHFULNESS,
        ),
    ] = None,
    random_orders: Annotated[
        int, typer.Option(help="Random patch orders averaged for the baseline.", rich_help_panel=_FAITHFULNESS)
    ] = 5,
    order_seed: Annotated[int, typer.Option(help="Seed of the random orders.", rich_help_panel=_FAITHFULNESS)] = 0,
    contrast: ContrastOption = None,
    ig_steps: IgStepsOption = DEFAULT_IG_STEPS,
    baseline: BaselineOption = Baseline.gray,
    samples: SamplesOption = DEFAULT_SAMPLES,
    noise: NoiseOption = DEFAULT_NOISE,
    noise_seed: NoiseSeedOption = 0,
    masks: MasksOption = None,
    robustness: RobustnessOption = False,
    radius: RadiusOption = DEFAULT_RADIUS,
    road: RoadOption = False,
    sanity: SanityOption = False,
    sanity_seed: SanitySeedOption = 0,
    sanity_threshold: SanityThresholdOption = DEFAULT_SANITY_THRESHOLD,
    target_image: TargetImageOption = None,
    target_direction: TargetDirectionOption = None,
    target_feature: TargetFeatureOption = None,
    target_text: TargetTextOption = None,
    contrast_text: ContrastTextOption = None,
) -> None:
    """Explanation maps on the patch grid for one class, side by side over the crop, with raw values; with
    --faithfulness, deletion and insertion curves that rank the maps against random orders."""
    context.run(
        explain_jobs(
            method,
            target,
            block,
            fill,
            faithfulness,
            steps,
            random_orders,
            order_seed,
            contrast,
            ig_steps,
            baseline,
            samples,
            noise,
            noise_seed,
            None if masks is None else str(masks),
            robustness,
            radius,
            road,
            sanity,
            sanity_seed,
            sanity_threshold,
            target_image,
            target_direction,
            target_feature,
            target_text,
            contrast_text,
        ),
        images,
    )
