"""`vitcli anatomy`: what a ViT learned about space, one result per view: its Jobs and their builder.

filters and positions read the weights alone (the model folder's `model` subject); distance, cka, pca and norms read
a set of images (a `set-...` subject) and share one forward per image (vitcli.experiments.anatomy).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from vitcli.errors import UsageError, VitcliError
from vitcli.jobs import Job, Presentation, builds_jobs
from vitcli.naming import result_name, setting


class View(StrEnum):
    filters = "filters"
    positions = "positions"
    distance = "distance"
    cka = "cka"
    pca = "pca"
    norms = "norms"


MODEL_VIEWS = (View.filters, View.positions)  # the weights alone: no image needed
IMAGE_VIEWS = (View.distance, View.cka, View.pca, View.norms)  # over a set of images, one forward per image
# The same as vitcli.experiments.anatomy_images' (a test checks), which imports torch: commands start without it.
DEFAULT_NORM_FACTOR = 3.0
DEFAULT_PCA_THRESHOLD = 0.5  # on the first component min-max scaled over the set: above it is foreground
DEFAULT_CKA_MINIBATCH = 32
MIN_CKA_IMAGES = 4  # the unbiased HSIC estimator needs at least 4 examples
MAX_CKA_MINIBATCH = 4096
# The one option a view's result depends on: its Survey attribute (and settings key), its short name in the result's
# name, and the type the name is written from.
VIEW_SETTING: dict[View, tuple[str, str, type]] = {
    View.norms: ("norm_factor", "f", float),
    View.pca: ("pca_threshold", "t", float),
    View.cka: ("cka_minibatch", "mb", int),
}


class AnatomyJob(Job):
    """One view. Jobs of one `anatomy` call share a Survey, so the image views cost one forward per image together."""

    command = "anatomy"
    needs_classes = False

    def __init__(self, view: View, survey: Survey):
        self.view = view
        self.survey = survey
        self.scope = "model" if view in MODEL_VIEWS else "set"  # type: ignore[misc]

    def check_images(self, count: int) -> None:
        check_image_count(self.view, count)

    def uses(self) -> tuple[str, ...]:
        return (f"anatomy --view {self.view.value}",)

    def name(self) -> str:
        if self.view not in VIEW_SETTING:
            return result_name(f"anatomy-{self.view.value}")
        key, short, kind = VIEW_SETTING[self.view]
        return result_name(f"anatomy-{self.view.value}", setting(short, kind(getattr(self.survey, key))))

    def settings(self) -> dict[str, Any]:
        chosen: dict[str, Any] = {"view": self.view.value}
        if self.view in VIEW_SETTING:
            key = VIEW_SETTING[self.view][0]
            chosen[key] = getattr(self.survey, key)
        return chosen

    def compute_once(self, model: Any) -> Any:
        return self.survey.model_view(model, self.view)

    def compute_set(self, model: Any, paths: list[Path], steps: Any) -> Any:
        result = self.survey.image_view(model, paths, self.view, steps)
        if not hasattr(result, "weights"):  # the figures and tables name the weights
            result.weights = model.spec.label
        return result

    def present(self, result: Any) -> Presentation:
        from vitcli.presentation.anatomy import present

        return present(self.view.value, result)


class Survey:
    """The settings of one `anatomy` call and the image views' results, computed together on first use."""

    def __init__(self, views: list[View], norm_factor: float, pca_threshold: float, cka_minibatch: int):
        self.views = views
        self.norm_factor = norm_factor
        self.pca_threshold = pca_threshold
        self.cka_minibatch = cka_minibatch
        self._computed: dict[tuple[int, tuple[Path, ...]], dict[str, Any]] = {}

    def model_view(self, model: Any, view: View) -> Any:
        from vitcli.experiments import anatomy_weights

        if view is View.filters:
            return anatomy_weights.filters(model)
        return anatomy_weights.positions(model)

    def image_view(self, model: Any, paths: list[Path], view: View, steps: Any) -> Any:
        key = (id(model), tuple(paths))
        if key not in self._computed:
            self._computed = {key: self._compute(model, paths, steps)}  # one set at a time: earlier ones are dropped
        return getattr(self._computed[key], view.value)

    def _compute(self, model: Any, paths: list[Path], steps: Any) -> Any:
        from vitcli.experiments.anatomy_images import measure

        steps.start(len(paths), "images (one forward each)")
        done = [0]

        def advance(count: int) -> None:  # measure reports the images done so far
            steps.advance(count - done[0])
            done[0] = count

        skipped: list[str] = []

        def readable() -> Iterator[Any]:
            """The images that decode; one that does not is left out of the set, its one-line refusal kept."""
            for path in paths:
                try:
                    yield model.prepare(path)
                except VitcliError as error:
                    skipped.append(str(error))

        anatomy = measure(
            model,
            readable(),
            [view.value for view in self.views if view in IMAGE_VIEWS],
            pca_threshold=self.pca_threshold,
            norm_factor=self.norm_factor,
            cka_minibatch=self.cka_minibatch,
            progress=advance,
        )
        for view in IMAGE_VIEWS:
            if getattr(anatomy, view) is not None:
                getattr(anatomy, view).skipped = skipped
        return anatomy


def check_image_count(views: View | list[View], count: int) -> None:
    """Views that need images refused without any (naming them), and cka with fewer than two."""
    views = [views] if isinstance(views, View) else views
    needing = [view.value for view in views if view in IMAGE_VIEWS]
    if needing and count == 0:
        raise UsageError(
            f"--view {', '.join(needing)} {'needs' if len(needing) == 1 else 'need'} images: give image files or a "
            f"folder (only {', '.join(view.value for view in MODEL_VIEWS)} read the weights alone)"
        )
    if View.cka in views and 0 < count < MIN_CKA_IMAGES:
        raise UsageError(
            f"--view cka needs at least {MIN_CKA_IMAGES} images (CKA compares blocks across images; its unbiased "
            f"estimator needs {MIN_CKA_IMAGES}), got {count}"
        )


def chosen_views(view: list[View | str] | None, with_images: bool) -> list[View]:
    """The views asked for, in the canonical order, each once; by default all of them with images, else those that
    need none."""
    if not view:
        return list(View) if with_images else list(MODEL_VIEWS)
    known = [choice.value for choice in View]
    unknown = [str(item) for item in view if str(item) not in known]
    if unknown:
        raise UsageError(f"--view must be one of {', '.join(known)}, not {unknown[0]}")
    asked = {View(str(item)) for item in view}
    return [choice for choice in View if choice in asked]


@builds_jobs("anatomy")
def anatomy_jobs(
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
    with_images: bool = True,
) -> list[Job]:
    """One job per view, sharing one Survey. `with_images`: whether images come (the default views depend on it)."""
    if not math.isfinite(norm_factor) or norm_factor <= 0:
        raise UsageError(f"--norm-factor must be a positive number (times the block's median norm), not {norm_factor}")
    if not math.isfinite(pca_threshold):
        raise UsageError(f"--pca-threshold must be a finite number, not {pca_threshold}")
    if not MIN_CKA_IMAGES <= cka_minibatch <= MAX_CKA_MINIBATCH:
        raise UsageError(
            f"--cka-minibatch must be between {MIN_CKA_IMAGES} and {MAX_CKA_MINIBATCH} images, not {cka_minibatch}"
        )
    views = chosen_views(view, with_images)
    survey = Survey(views, float(norm_factor), float(pca_threshold), int(cka_minibatch))
    return [AnatomyJob(choice, survey) for choice in views]
