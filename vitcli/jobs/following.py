"""What a job follows: a class (--target) or a target in embedding space (vitcli.targets), the options that name it
declared once for every command that follows a target, and the embedding target bound to the loaded model once. A
class given as text is resolved by vitcli.target_class into the job's TargetPlan when it is planned."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from vitcli.naming import setting
from vitcli.targets import EmbeddingTarget, parse_embedding_target

if TYPE_CHECKING:
    from vitcli.model import VitModel
    from vitcli.targets import BoundTarget


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

# The embedding target's options, after a builder's own in --help (follows_embedding_target adds them).
EMBEDDING_TARGET_OPTIONS = [
    inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=None)
    for name, annotation in (
        ("target_image", TargetImageOption),
        ("target_direction", TargetDirectionOption),
        ("target_feature", TargetFeatureOption),
        ("target_text", TargetTextOption),
        ("contrast_text", ContrastTextOption),
    )
]


def follows_embedding_target(builder: Callable[..., Any]) -> Callable[..., Any]:
    """A builder of jobs that follow a class (its `target`, and its `contrast` where it has one) or a target in
    embedding space: it takes the embedding target's options after its own and gets them as one checked `embedding`
    (keyword-only, None when none is given; vitcli.targets.parse_embedding_target refuses contradictions)."""
    declared = inspect.signature(builder, eval_str=True)
    own = [parameter for parameter in declared.parameters.values() if parameter.name != "embedding"]
    signature = declared.replace(parameters=own + EMBEDDING_TARGET_OPTIONS)

    @functools.wraps(builder)
    def with_embedding(*arguments: Any, **options: Any) -> Any:
        given = signature.bind(*arguments, **options).arguments
        embedding = parse_embedding_target(
            given.get("target"),
            given.pop("target_image", None),
            given.pop("target_direction", None),
            given.pop("target_feature", None),
            given.get("contrast"),
            given.pop("target_text", None),
            given.pop("contrast_text", None),
        )
        return builder(**given, embedding=embedding)

    with_embedding.__signature__ = signature  # type: ignore[attr-defined]
    with_embedding.__annotations__ = {
        parameter.name: parameter.annotation for parameter in signature.parameters.values()
    }
    return with_embedding


@dataclass(frozen=True)
class TargetPlan:
    """The classes a job follows, resolved against the model's labels by its plan()."""

    target: int | None  # None: each image's clean top-1
    contrast: int | None = None


class FollowsEmbedding:
    """A job's embedding target, bound to the loaded model on first use (REF's embedding computed once)."""

    embedding_target: EmbeddingTarget | None = None
    planned: Any  # the job's plan (Job.plan), whose `target` is the class followed otherwise (None: the clean top-1)
    _bound: tuple[int, BoundTarget] | None = None

    def bound_target(self, model: VitModel) -> BoundTarget | None:
        from vitcli.targets import bind

        if self.embedding_target is None:
            return None
        if self._bound is None or self._bound[0] != id(model):
            self._bound = (id(model), bind(self.embedding_target, model))
        return self._bound[1]

    def target_name_part(self) -> str | None:
        """The result name's part for what the job follows: the embedding target's, else t<class> (ttop1)."""
        if self.embedding_target is not None:
            return self.embedding_target.name_part
        target = self.planned.target
        return setting("t", "top1" if target is None else target)

    def embedding_settings(self) -> dict[str, Any]:
        """The target as JSON; once bound, with what the loaded model tells (a text target's scale)."""
        if self.embedding_target is None:
            return {}
        target = self.embedding_target if self._bound is None else self._bound[1].target
        return {"target": target.describe()}
