"""The options that name what a command follows, shared by every command that follows a target, as Typer types: a
class (--target) or a target in embedding space (vitcli.targets). What a job keeps of them is vitcli.jobs.following."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

_PANEL = "Targets in embedding space (any model, with or without a class head)"

TargetOption = Annotated[
    str | None,
    typer.Option(
        "--target",
        "-t",
        help="Class to follow: an index (256) or a label (Newfoundland). Default: the clean top-1.",
        show_default=False,
    ),
]

TargetImageOption = Annotated[
    Path | None,
    typer.Option(
        "--target-image",
        help="Follow the cosine similarity of the pooled embeddings of the image and of this reference image "
        "instead of a class.",
        show_default=False,
        rich_help_panel=_PANEL,
    ),
]

TargetDirectionOption = Annotated[
    Path | None,
    typer.Option(
        "--target-direction",
        help="Follow the dot product of the pooled embedding with the direction in this .npy file (a 1-D array as "
        "wide as the embedding: a class mean, a probe's weight row) instead of a class.",
        show_default=False,
        rich_help_panel=_PANEL,
    ),
]

TargetFeatureOption = Annotated[
    int | None,
    typer.Option(
        "--target-feature",
        help="Follow coordinate N (from 0) of the pooled embedding instead of a class.",
        show_default=False,
        rich_help_panel=_PANEL,
    ),
]

TargetTextOption = Annotated[
    str | None,
    typer.Option(
        "--target-text",
        help="Follow scale x the cosine similarity of the image embedding and this text's embedding (the zero-shot "
        "logit of the text; --template's templates apply to it) instead of a class. Needs a model with a text tower "
        "(open_clip CLIP or SigLIP).",
        show_default=False,
        rich_help_panel=_PANEL,
    ),
]

ContrastTextOption = Annotated[
    str | None,
    typer.Option(
        "--contrast-text",
        help="With --target-text: subtract the same score for this text (T's scaled cosine - U's).",
        show_default=False,
        rich_help_panel=_PANEL,
    ),
]
