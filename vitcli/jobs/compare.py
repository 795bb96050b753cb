"""`vitcli compare` as a library: its Job, one result about a set of images, and the builder that the command,
`vitcli run` configs and the Python API (vitcli.compare) call."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Any

import typer

from vitcli.errors import UsageError
from vitcli.jobs import Job, JobNotPlanned, Presentation, SetImages, Steps, builds_jobs
from vitcli.naming import result_name, setting
from vitcli.spec import fitted_count

DEFAULT_TOP_K = 5


@dataclass(frozen=True)
class ComparePlan:
    """A compare job's classes and top-k resolved against the model's labels (plan), and its pairs against the
    number of images (plan_images)."""

    classes: tuple[int, ...]  # empty: each image's top-1
    top_k: int
    pairs: tuple[tuple[int, int], ...] | None  # None: --pairs not yet resolved against the images (plan_images)


class CompareJob(Job):
    """One result about the images together (scope "set"): their readouts side by side, A~B and the pairs asked for
    block by block, and every pair's final similarity."""

    command = "compare"
    scope = "set"
    holds_every_image = True

    def __init__(
        self,
        classes: list[str] | None = None,
        top_k: int | None = None,
        pairs: str | None = None,
        planned: ComparePlan | None = None,
    ):
        self.class_texts = list(classes or [])
        self.top_k = top_k
        self.pairs_text = pairs
        self._planned = planned

    def check_images(self, count: int) -> None:
        """Two images or more, and the pairs asked for (--pairs) among them."""
        from vitcli.experiments.compare import parse_pairs

        if count < 2:
            raise UsageError(f"compare needs at least two images, got {count}")
        if self.pairs_text is not None:
            parse_pairs(self.pairs_text, count)

    def plan(self, architecture: Any) -> CompareJob:
        from vitcli.target_class import resolve_class

        top_k = fitted_count("--top-k", self.top_k, DEFAULT_TOP_K, architecture.num_classes, "the model's classes")
        classes = dict.fromkeys(resolve_class(architecture.labels, text, "--class") for text in self.class_texts)
        pairs = ((0, 1),) if self.pairs_text is None else None  # A~B alone without --pairs
        return CompareJob(self.class_texts, self.top_k, self.pairs_text, ComparePlan(tuple(classes), top_k, pairs))

    def plan_images(self, count: int) -> CompareJob:
        """The pairs asked for (--pairs, `all`) among `count` images."""
        from vitcli.experiments.compare import parse_pairs

        if self.pairs_text is None:
            return self
        pairs = tuple(parse_pairs(self.pairs_text, count))
        planned = replace(self.planned, pairs=pairs)
        return CompareJob(self.class_texts, self.top_k, self.pairs_text, planned)

    @property
    def pairs(self) -> list[tuple[int, int]]:
        """The pairs traced block by block, once planned for the images."""
        if self.planned.pairs is None:
            raise JobNotPlanned("the compare job was named or run before plan_images(count) resolved its --pairs")
        return list(self.planned.pairs)

    def name(self) -> str:
        planned = self.planned
        classes = setting("c", list(planned.classes)) if planned.classes else "ctop1"
        pairs = setting("p", [self._pair_name(pair, "-") for pair in self.pairs]) if self.pairs_text else None
        return result_name("compare", classes, setting("k", planned.top_k), pairs)

    def settings(self) -> dict[str, Any]:
        planned = self.planned
        pairs = [self._pair_name(pair, "~") for pair in self.pairs]
        return {"classes": list(planned.classes) or "top-1 of each image", "top_k": planned.top_k, "pairs": pairs}

    @staticmethod
    def _pair_name(pair: tuple[int, int], joint: str) -> str:
        from vitcli.experiments.compare import letter

        return f"{letter(pair[0])}{joint}{letter(pair[1])}"

    def compute_set(self, model: Any, paths: SetImages, steps: Steps) -> Any:
        from vitcli.experiments.compare import compare_images

        prepared = [paths.prepare(model, path) for path in paths]
        planned = self.planned
        return compare_images(model, prepared, list(planned.classes), planned.top_k, self.pairs)

    def subject_of(self, result: Any) -> dict[str, Any]:
        """Each image with its hash, size and mode, as a per-image result names its image."""
        return {"images": [image.source.to_json() for image in result.images]}

    def present(self, result: Any) -> Presentation:
        from vitcli.presentation import compare as view

        return Presentation.of(view, result)


@builds_jobs("compare")
def compare_jobs(
    classes: Annotated[
        list[str] | None,
        typer.Option(
            "--class",
            "-c",
            help='Classes for the readout w_c . h + b_c: an index (283) or a label ("sports car"); repeatable '
            "(default: each image's top-1).",
            show_default=False,
        ),
    ] = None,
    top_k: Annotated[
        int | None,
        typer.Option(
            "--top-k",
            "-k",
            help=f"Classes listed per image and readout (default {DEFAULT_TOP_K}, or the model's classes if fewer).",
            show_default=False,
        ),
    ] = None,
    pairs: Annotated[
        str | None,
        typer.Option(
            "--pairs",
            help="Pairs traced block by block besides A~B: letters or 1-based numbers joined by ~, comma-separated "
            "(A~C,B~D or 1~3), or 'all'; at most 10 pairs. Every pair's final similarity is in the N x N matrix.",
            show_default=False,
        ),
    ] = None,
) -> list[Job]:
    """One CompareJob over all the images of a run (or of the command's arguments)."""
    return [CompareJob(classes, top_k, pairs)]
