"""`vitcli compare` as a library: its Job (settings, checks, name, presentation); the command computes the result
about the image set itself, so there is no builder yet."""

from __future__ import annotations

from typing import Any

from vitcli.jobs import Job, Presentation
from vitcli.naming import result_name, setting
from vitcli.spec import fitted_count

DEFAULT_TOP_K = 5


class CompareJob(Job):
    """One result about an image set: computed by the command, not per image (so no `vitcli run` builder)."""

    command = "compare"

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

    def present(self, result: Any) -> Presentation:
        from vitcli.presentation import compare as view

        return Presentation.of(view, result)
