"""`vitcli compare` as a library: its Job, one result about a set of images, and the builder that the command,
`vitcli run` configs and the Python API (vitcli.compare) call."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from vitcli.errors import UsageError
from vitcli.jobs import Job, Presentation, SetImages, Steps, builds_jobs
from vitcli.naming import result_name, setting
from vitcli.spec import fitted_count

DEFAULT_TOP_K = 5


class CompareJob(Job):
    """One result about the images together (scope "set"): their readouts side by side, A~B and the pairs asked for
    block by block, and every pair's final similarity."""

    command = "compare"
    scope = "set"
    holds_every_image = True

    def __init__(self, classes: list[str] | None = None, top_k: int | None = None, pairs: str | None = None):
        self.class_texts = list(classes or [])
        self.top_k = top_k
        self.pairs_text = pairs
        self.classes: list[int] = []  # resolved against the labels by check()
        self.pairs: list[tuple[int, int]] = [(0, 1)]  # resolved against the images by choose_pairs()

    def choose_pairs(self, count: int) -> None:
        from vitcli.experiments.compare import parse_pairs

        if self.pairs_text is not None:
            self.pairs = parse_pairs(self.pairs_text, count)

    def check_images(self, count: int) -> None:
        """Two images or more; the pairs asked for (--pairs) resolved against their number."""
        if count < 2:
            raise UsageError(f"compare needs at least two images, got {count}")
        self.choose_pairs(count)

    def check(self, architecture: Any) -> None:
        from vitcli.target_class import resolve_class

        self.top_k = fitted_count("--top-k", self.top_k, DEFAULT_TOP_K, architecture.num_classes, "the model's classes")
        self.classes = list(
            dict.fromkeys(resolve_class(architecture.labels, text, "--class") for text in self.class_texts)
        )

    def name(self) -> str:
        classes = setting("c", self.classes) if self.classes else "ctop1"
        pairs = setting("p", [self._pair_name(pair, "-") for pair in self.pairs]) if self.pairs_text else None
        return result_name("compare", classes, setting("k", self.top_k), pairs)

    def settings(self) -> dict[str, Any]:
        pairs = [self._pair_name(pair, "~") for pair in self.pairs]
        return {"classes": self.classes or "top-1 of each image", "top_k": self.top_k, "pairs": pairs}

    @staticmethod
    def _pair_name(pair: tuple[int, int], joint: str) -> str:
        from vitcli.experiments.compare import letter

        return f"{letter(pair[0])}{joint}{letter(pair[1])}"

    def compute_set(self, model: Any, paths: SetImages, steps: Steps) -> Any:
        from vitcli.experiments.compare import compare_images

        prepared = [paths.prepare(model, path) for path in paths]
        return compare_images(model, prepared, self.classes, self.top_k, self.pairs)

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
