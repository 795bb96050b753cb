"""`vitcli bench` as a library: explain's computation (maps, audits, faithfulness curves) over every method, graded
per image against its mask, and the leaderboard over images as the job's `present_across_images`, so that shards,
resumed runs and `vitcli merge` recompute it exactly from the stored per-image results."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vitcli.errors import UsageError
from vitcli.experiments.bench import SCORES, parse_scores
from vitcli.experiments.explain_options import (
    DEFAULT_IG_STEPS,
    DEFAULT_NOISE,
    DEFAULT_RADIUS,
    DEFAULT_SAMPLES,
    AuditOptions,
    GradientOptions,
    check_audit_options,
    check_gradient_options,
)
from vitcli.explain_methods import EXPLAIN_METHODS
from vitcli.jobs import ImageWork, Job, Presentation, builds_jobs
from vitcli.jobs.explain import ExplainJob, refuse_on_stages
from vitcli.jobs.explain_options import audit_name_parts
from vitcli.naming import result_name, setting

# Every method bench grades, in the leaderboard's order: explain's maps, then the random-map and edge-map baselines.
BENCH_METHODS = (
    "relevance", "grad-rollout", "gradcam", "attention", "rollout", "occlusion", "ig", "smoothgrad", "gradient",
    "random", "edge",
)  # fmt: skip
BENCH_STEPS = 14  # deletion and insertion points: one grid row's worth of patches per step on 14x14


def method_refusal(method: str, block: int, architecture: Any) -> str | None:
    """Why `method` cannot run on the architecture (the refusal explain would give), or None."""
    from vitcli.capture.support import support_refusal

    if method not in EXPLAIN_METHODS:
        return "not among explain's methods in this vitcli"
    if EXPLAIN_METHODS[method].needs is not None:
        refusal = support_refusal(f"explain --method {method}", architecture)
        if refusal is not None:
            return refusal
    if architecture.staged:
        try:
            refuse_on_stages([method], block, architecture)
        except UsageError as error:
            return str(error)
    return None


@dataclass
class BenchResult:
    explanation: Any  # experiments.explain.Explanation, with its audits and faithfulness curves
    scores: dict[str, dict[str, float]]  # method -> score -> value
    unavailable: dict[str, str]  # method -> why it did not run
    scene: dict[str, Any] = field(default_factory=dict)  # the scene's sidecar facts, when there is one


class BenchJob(ExplainJob):
    command = "bench"

    def __init__(
        self,
        methods: list[str],
        scores: list[str],
        block: int | None,
        fill: str,
        steps: int | None,
        gradients: GradientOptions,
        audits: AuditOptions,
    ):
        faithfulness = bool({"deletion", "insertion"} & set(scores))
        # The random-map method is the baseline: no random patch orders beside it.
        super().__init__(methods, None, block, fill, faithfulness, steps, 0, 0, gradients=gradients, audits=audits)
        self.requested = methods
        self.scores = scores
        self.unavailable: dict[str, str] = {}

    def use_masks(self, folder: Path) -> None:
        """The masks in `folder`, once the command has generated them."""
        if any(score.needs_masks and score.option in self.scores for score in SCORES):
            self.audits = replace(self.audits, masks=folder)

    def check(self, architecture: Any) -> None:
        block = self.block or architecture.depth
        refusals = {method: method_refusal(method, block, architecture) for method in self.requested}
        self.unavailable = {method: why for method, why in refusals.items() if why is not None}
        self.methods = [method for method in self.requested if method not in self.unavailable]
        if not self.methods:
            first, why = next(iter(self.unavailable.items()))
            raise UsageError(f"no method of bench runs on {architecture.name}: {first}: {why}")
        if self.faithfulness and self.steps is None:
            self.steps = min(BENCH_STEPS, architecture.map_grid.num_patches)
        super().check(architecture)

    def uses(self) -> tuple[str, ...]:
        return (
            "explain",
        )  # each method's own needs are checked in check(): one that cannot run is a row, not a refusal

    def name(self) -> str:
        parts = [
            setting("m", self.requested),
            setting("s", self.scores),
            setting("b", self.block),
            self.fill,
            setting("f", self.steps) if self.faithfulness else None,
            *audit_name_parts(self.audits, self.gradients),
        ]
        if "ig" in self.requested:
            parts += [setting("ig", self.gradients.ig_steps), self.gradients.baseline]
        if "smoothgrad" in self.requested or self.audits.robustness:
            parts += [setting("n", self.gradients.samples), setting("ns", self.gradients.seed)]
        return result_name("bench", *dict.fromkeys(parts))

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "methods": self.requested, "scores": self.scores, "run_methods": self.methods}

    def compute(self, work: ImageWork) -> BenchResult:
        from vitcli.experiments.bench import image_scores, scene_facts
        from vitcli.experiments.localisation import focus
        from vitcli.presentation.explain import document
        from vitcli.presentation.explain_audit import audits_json

        facts = scene_facts(work.image.source.path)
        explanation = self.explain_image(work, facts.label)  # a scene's true class; else the top-1
        score_names = [score.name for score in SCORES if score.option in self.scores]
        body = {**document(explanation), "audits": audits_json(explanation)}
        scores = image_scores(body, self.methods, score_names)
        if facts.kind == "mosaic" and "focus" in score_names:
            for item in explanation.maps:
                value = focus(item.values, facts.quadrant_flags(), work.model.map_grid.patch_size)
                if value is not None:
                    scores[item.method]["focus"] = value
        scene = {"label": facts.label, "kind": facts.kind, "quadrants": list(facts.quadrants)}
        return BenchResult(explanation, scores, dict(self.unavailable), scene)

    def present(self, result: BenchResult) -> Presentation:
        from vitcli.presentation import bench as view

        explained = super().present(result.explanation)
        label = result.explanation.source.display_name
        document = {
            **explained.document,
            "bench": {"scores": result.scores, "unavailable": result.unavailable, "scene": result.scene},
        }
        return Presentation(
            view.image_table(result.scores, result.unavailable, label),
            view.image_rows(result.scores, result.unavailable),
            document,
            figure=explained.figure,
            extra_files=explained.extra_files,
            summary=view.image_summary(result.scores),
        )

    @classmethod
    def present_across_images(cls, documents: list[dict[str, Any]]) -> Presentation | None:
        """The leaderboard: per method and score, the mean over the images with its bootstrap interval, from the
        stored results' `bench` bodies alone."""
        from vitcli.experiments.bench import leaderboard
        from vitcli.presentation import bench as view

        rows = leaderboard(documents)
        if not rows:
            return None
        weights = documents[0].get("weights", "")
        return Presentation(
            view.leaderboard_table(rows),
            view.leaderboard_rows(rows),
            view.leaderboard_document(rows, len(documents)),
            figure=lambda: view.leaderboard_figure(rows, weights),
            summary={},
        )


@builds_jobs("bench")
def bench_jobs(
    method: list[str] | None = None,
    scores: str | None = None,
    masks: str | None = None,
    block: int | None = None,
    fill: str = "gray",
    steps: int | None = None,
    ig_steps: int = DEFAULT_IG_STEPS,
    baseline: str = "gray",
    samples: int = DEFAULT_SAMPLES,
    noise: float = DEFAULT_NOISE,
    noise_seed: int = 0,
    radius: float = DEFAULT_RADIUS,
    sanity_seed: int = 0,
    masks_later: bool = False,
) -> list[Job]:
    """`masks_later`: the command's --scenes, whose masks are generated after these checks (BenchJob.use_masks); no
    config option, so a config's bench always names its `masks`."""
    chosen = parse_scores(scores)
    methods = list(dict.fromkeys(str(choice) for choice in method or BENCH_METHODS))
    unknown = [choice for choice in methods if choice not in BENCH_METHODS]
    if unknown:
        raise UsageError(f"unknown method {unknown[0]!r}: choose from {', '.join(BENCH_METHODS)}")
    mask_scores = list(dict.fromkeys(score.option for score in SCORES if score.needs_masks and score.option in chosen))
    if masks is None and not masks_later and mask_scores:
        raise UsageError(
            f"--scores {','.join(mask_scores)} grade the maps against masks: give --masks DIR (or --scenes N), "
            "or leave them out of --scores"
        )
    gradients = GradientOptions(ig_steps, str(baseline), samples, noise, noise_seed)
    check_gradient_options(gradients)
    folder = None if masks is None else Path(masks)
    audits = AuditOptions(
        folder if mask_scores else None,
        robustness="sensitivity" in chosen,
        radius=radius,
        road="road" in chosen,
        sanity="sanity" in chosen,
        sanity_seed=sanity_seed,
    )
    check_audit_options(audits)
    return [BenchJob(methods, chosen, block, str(fill), steps, gradients, audits)]
