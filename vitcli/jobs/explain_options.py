"""explain's options for the input-gradient methods, the faithfulness curves and the audits: their declarations
(typed parameters of explain's builder, vitcli.declared_options), the baseline's choices, and their parts of a
result's name and settings (kept apart so vitcli/jobs/explain.py stays readable)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from vitcli.experiments.explain_options import MAX_IG_STEPS, MAX_SAMPLES, AuditOptions, GradientOptions
from vitcli.naming import path_hash, safe_name, setting


class Baseline(StrEnum):
    gray = "gray"
    black = "black"
    blur = "blur"


_GRADIENTS = "Input-gradient options (ig, smoothgrad, gradient)"
_AUDITS = "Audits of the maps"


ContrastOption = Annotated[
    str | None,
    typer.Option(
        help="A second class: the gradient methods and dla explain logit(target) - logit(this class), "
        "'why the target rather than this'.",
        show_default=False,
    ),
]

IgStepsOption = Annotated[
    int,
    typer.Option(help=f"Integrated Gradients' points on the path (2..{MAX_IG_STEPS}).", rich_help_panel=_GRADIENTS),
]

BaselineOption = Annotated[
    Baseline, typer.Option(help="Integrated Gradients' baseline image (as the fills).", rich_help_panel=_GRADIENTS)
]

SamplesOption = Annotated[
    int, typer.Option(help=f"SmoothGrad's noisy copies (1..{MAX_SAMPLES}).", rich_help_panel=_GRADIENTS)
]

NoiseOption = Annotated[
    float,
    typer.Option(
        help="SmoothGrad's sigma as a fraction of the normalized input's range (max - min).",
        rich_help_panel=_GRADIENTS,
    ),
]

NoiseSeedOption = Annotated[
    int,
    typer.Option(
        help="Seed of SmoothGrad's noise, --robustness's perturbations, --road's imputation noise and the random "
        "baseline's maps.",
        rich_help_panel=_GRADIENTS,
    ),
]

MasksOption = Annotated[
    Path | None,
    typer.Option(
        help="Folder of segmentation masks, IMAGE_STEM.png each (Oxford-IIIT Pet trimaps: 1 = object; others: "
        "non-zero = object): the pointing game and relevance mass accuracy (positive and signed) of every map, and "
        "Focus when a mask is one to three whole quadrants (a 2x2 mosaic's target quadrants).",
        show_default=False,
        rich_help_panel=_AUDITS,
    ),
]

RobustnessOption = Annotated[
    bool,
    typer.Option(
        "--robustness",
        help="Max- and average-sensitivity of every map (Yeh et al. 2019) over --samples perturbations uniform "
        "in +-radius, seeded by --noise-seed.",
        rich_help_panel=_AUDITS,
    ),
]

RadiusOption = Annotated[
    float,
    typer.Option(help="--robustness's radius, a fraction of the pixel range [0, 1].", rich_help_panel=_AUDITS),
]

RoadOption = Annotated[
    bool,
    typer.Option(
        "--road",
        help="ROAD (Rong et al. 2022): MoRF and LeRF curves with noisy linear imputation, p = 10..90%, and "
        "their combined score; noise seeded by --noise-seed.",
        rich_help_panel=_AUDITS,
    ),
]

SanityOption = Annotated[
    bool,
    typer.Option(
        "--sanity",
        help="Sanity checks (Adebayo et al. 2018): every map recomputed after cascading and independent "
        "randomisation of the blocks (timm's initialisers) and for a random class; Spearman and SSIM per step.",
        rich_help_panel=_AUDITS,
    ),
]

SanitySeedOption = Annotated[int, typer.Option(help="Seed of the randomised weights.", rich_help_panel=_AUDITS)]

SanityThresholdOption = Annotated[
    float,
    typer.Option(
        help="A map passes when its Spearman |map| correlation with the original falls below this once every "
        "block is randomised.",
        rich_help_panel=_AUDITS,
    ),
]


def audit_name_parts(audits: AuditOptions, gradients: GradientOptions) -> list[str | None]:
    # The folder's name and a hash of where it is: two folders called `masks` are two settings.
    masks = None if audits.masks is None else f"{safe_name(audits.masks.name, 'masks')}-{path_hash(audits.masks, 8)}"
    parts = [setting("masks", masks)]
    if audits.robustness:
        parts += [setting("rob", gradients.samples), setting("r", audits.radius)]
    if audits.robustness or audits.road:
        parts.append(setting("ns", gradients.seed))
    parts.append("road" if audits.road else None)
    if audits.sanity:
        parts += [setting("san", audits.sanity_seed), setting("th", audits.sanity_threshold)]
    return parts


def audit_settings(audits: AuditOptions) -> dict[str, Any]:
    return {
        "masks": None if audits.masks is None else str(audits.masks),
        "robustness": audits.robustness,
        "radius": audits.radius,
        "road": audits.road,
        "sanity": audits.sanity,
        "sanity_seed": audits.sanity_seed,
        "sanity_threshold": audits.sanity_threshold,
    }


_FAITHFULNESS = "Faithfulness options"
DEFAULT_STEPS = 49  # a quarter of the patches per step on the 14x14 grid; never more than the grid's patches

FaithfulnessOption = Annotated[
    bool,
    typer.Option(
        "--faithfulness",
        help="Deletion and insertion curves per map and their AUCs (trapezoidal over the fraction of patches "
        "0..1, unperturbed point included; lower deletion and higher insertion AUC are better).",
        rich_help_panel=_FAITHFULNESS,
    ),
]

StepsOption = Annotated[
    int | None,
    typer.Option(
        help=f"Points after the unperturbed one (default {DEFAULT_STEPS}, at most the patches).",
        show_default=False,
        rich_help_panel=_FAITHFULNESS,
    ),
]

RandomOrdersOption = Annotated[
    int, typer.Option(help="Random patch orders averaged for the baseline.", rich_help_panel=_FAITHFULNESS)
]

OrderSeedOption = Annotated[int, typer.Option(help="Seed of the random orders.", rich_help_panel=_FAITHFULNESS)]
