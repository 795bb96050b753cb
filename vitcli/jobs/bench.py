"""`vitcli bench` as a library: explain's computation (maps, audits, faithfulness curves) over every method, graded
per image against its mask, and the leaderboard over images as the job's `present_across_images`, so that shards,
resumed runs and `vitcli merge` recompute it exactly from the stored per-image results. Its builder declares the
command's options; the command runs its Jobs through the batch engine (vitcli.batch.bench)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from vitcli.errors import UsageError
from vitcli.experiments.bench import SCORE_OPTIONS, SCORES, parse_scores
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
from vitcli.explain_methods import EXPLAIN_METHODS, METHOD_NAMES
from vitcli.jobs import ImageWork, Job, Presentation, builds_jobs
from vitcli.jobs.explain import ExplainJob, ExplainPlan, refuse_on_stages
from vitcli.jobs.explain_options import (
    Baseline,
    BaselineOption,
    IgStepsOption,
    NoiseOption,
    NoiseSeedOption,
    RadiusOption,
    SamplesOption,
    SanitySeedOption,
    audit_name_parts,
)
from vitcli.jobs.occlude import Fill
from vitcli.naming import result_name, setting

# Every method bench grades, in the registry's order: explain's maps, then the random-map and edge-map baselines.
# dla (attribute's per-token decomposition) is left out, as bench was built; the registry is the one list of names.
BENCH_METHODS = tuple(name for name in METHOD_NAMES if name != "dla")
BENCH_STEPS = 14  # deletion and insertion points: one grid row's worth of patches per step on 14x14
BenchMethod = StrEnum("BenchMethod", {name.replace("-", "_"): name for name in BENCH_METHODS})
_SCENES = "Scenes"
# The command's own options about what it grades and how it reruns, not about the Jobs: `vitcli bench` takes them
# out before it calls the builder (vitcli.batch.bench); a config's bench grades the run's images.
COMMAND_ONLY = ("scenes", "mosaics", "scene_seed", "force")


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


@dataclass(frozen=True)
class BenchPlan(ExplainPlan):
    """explain's plan for the methods that run on the model (BenchJob.plan), with which run and why the others
    cannot."""

    methods: tuple[str, ...]  # the requested methods that run, in the requested order
    unavailable: tuple[tuple[str, str], ...]  # (method, why it cannot run on the model)


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
        planned: BenchPlan | None = None,
    ):
        faithfulness = bool({"deletion", "insertion"} & set(scores))
        # The random-map method is the baseline: no random patch orders beside it.
        super().__init__(
            methods, None, block, fill, faithfulness, steps, 0, 0, gradients=gradients, audits=audits, planned=planned
        )
        self.scores = scores

    def plan(self, architecture: Any) -> BenchJob:
        """A method that cannot run on the model is not a refusal but a reason, kept in the plan; explain's plan of
        the methods that run refuses the rest (a block or step count out of range)."""
        block = architecture.depth if self.block is None else self.block
        refusals = {method: method_refusal(method, block, architecture) for method in self.methods}
        unavailable = {method: why for method, why in refusals.items() if why is not None}
        runs = [method for method in self.methods if method not in unavailable]
        if not runs:
            first, why = next(iter(unavailable.items()))
            raise UsageError(f"no method of bench runs on {architecture.name}: {first}: {why}")
        steps = self.steps
        if self.faithfulness and steps is None:
            steps = min(BENCH_STEPS, architecture.map_grid.num_patches)
        explained = ExplainJob(
            runs,
            None,
            self.block,
            self.fill,
            self.faithfulness,
            steps,
            0,
            0,
            gradients=self.gradients,
            audits=self.audits,
        ).plan(architecture)
        planned = BenchPlan(**asdict(explained.planned), methods=tuple(runs), unavailable=tuple(unavailable.items()))
        return BenchJob(
            self.methods, self.scores, self.block, self.fill, self.steps, self.gradients, self.audits, planned
        )

    def uses(self) -> tuple[str, ...]:
        return ("explain",)  # each method's own needs are planned: one that cannot run is a row, not a refusal

    def name(self) -> str:
        planned = self.planned
        parts = [
            setting("m", self.methods),
            setting("s", self.scores),
            setting("b", self.block),
            self.fill,
            setting("f", planned.steps) if self.faithfulness else None,
            *audit_name_parts(self.audits, self.gradients),
        ]
        if "ig" in self.methods:
            parts += [setting("ig", self.gradients.ig_steps), self.gradients.baseline]
        if "smoothgrad" in self.methods or self.audits.robustness:
            parts += [setting("n", self.gradients.samples), setting("ns", self.gradients.seed)]
        return result_name("bench", *dict.fromkeys(parts))

    def settings(self) -> dict[str, Any]:
        return {
            **super().settings(),
            "methods": self.methods,
            "scores": self.scores,
            "run_methods": list(self.planned.methods),
        }

    def compute(self, work: ImageWork) -> BenchResult:
        from vitcli.experiments.bench import image_scores, scene_facts
        from vitcli.experiments.localisation import focus
        from vitcli.presentation.explain import document
        from vitcli.presentation.explain_audit import audits_json

        facts = scene_facts(work.image.source.path)
        planned = self.planned
        methods = list(planned.methods)
        explanation = self.explain_image(work, facts.label, methods)  # a scene's true class; else the top-1
        score_names = [score.name for score in SCORES if score.option in self.scores]
        body = {**document(explanation), "audits": audits_json(explanation)}
        scores = image_scores(body, methods, score_names)
        if facts.kind == "mosaic" and "focus" in score_names:
            for item in explanation.maps:
                value = focus(item.values, facts.quadrant_flags(), work.model.map_grid.patch_size)
                if value is not None:
                    scores[item.method]["focus"] = value
        scene = {"label": facts.label, "kind": facts.kind, "quadrants": list(facts.quadrants)}
        return BenchResult(explanation, scores, dict(planned.unavailable), scene)

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
    method: Annotated[
        list[BenchMethod] | None,
        typer.Option(
            "--method",
            "-M",
            help="Methods to grade (repeatable): explain's methods, random (a random map) and edge (an edge map) as "
            "baselines. Default: all; one that cannot run on the model gets a row saying why.",
            show_default=False,
        ),
    ] = None,
    scores: Annotated[
        str | None,
        typer.Option(
            help=f"Comma-separated scores: {', '.join(SCORE_OPTIONS)} (default: all). focus needs --mosaics; "
            "pointing and mass need masks.",
            show_default=False,
        ),
    ] = None,
    masks: Annotated[
        Path | None,
        typer.Option(
            help="Folder of the images' masks, IMAGE_STEM.png each (non-zero = object; trimaps: 1 = object), of the "
            "image's size; images without one are left out with a warning.",
            show_default=False,
        ),
    ] = None,
    scenes: Annotated[
        int | None,
        typer.Option(help="Generate this many scenes with object masks and grade them.", rich_help_panel=_SCENES),
    ] = None,
    mosaics: Annotated[
        int | None,
        typer.Option(help="Generate this many 2x2 mosaics (Focus).", rich_help_panel=_SCENES, show_default=False),
    ] = None,
    scene_seed: Annotated[int, typer.Option(help="Seed of the generated scenes.", rich_help_panel=_SCENES)] = 0,
    block: Annotated[
        int | None,
        typer.Option(help="Block Grad-CAM and attention read (default: the last).", show_default=False),
    ] = None,
    fill: Annotated[
        Fill, typer.Option(help="What covered pixels become (occlusion, deletion, insertion).")
    ] = Fill.gray,
    steps: Annotated[
        int | None,
        typer.Option(help=f"Deletion and insertion points (default {BENCH_STEPS}).", show_default=False),
    ] = None,
    ig_steps: IgStepsOption = DEFAULT_IG_STEPS,
    baseline: BaselineOption = Baseline.gray,
    samples: SamplesOption = DEFAULT_SAMPLES,
    noise: NoiseOption = DEFAULT_NOISE,
    noise_seed: NoiseSeedOption = 0,
    radius: RadiusOption = DEFAULT_RADIUS,
    sanity_seed: SanitySeedOption = 0,
    force: Annotated[
        bool, typer.Option("--force", help="Redo every result, even those an earlier run completed.")
    ] = False,
    masks_later: bool = False,
) -> list[Job]:
    """One BenchJob. `scenes`, `mosaics`, `scene_seed` and `force` (COMMAND_ONLY) are the command's, which generates
    the scenes and reruns itself and calls this without them; given here (a `vitcli run` config, the API) they are
    refused: there the images are the run's. `masks_later`: the command's scenes, whose masks are written after
    these checks; no option, so a config's bench always names its `masks`."""
    given = {"scenes": scenes, "mosaics": mosaics, "scene_seed": scene_seed or None, "force": force or None}
    named = [name for name in COMMAND_ONLY if given[name] is not None]
    if named:
        option = "--" + named[0].replace("_", "-")
        raise UsageError(
            f"{option} belongs to `vitcli bench`, which generates its scenes and reruns itself; here bench grades the "
            "run's images against `masks` (`vitcli run --force` redoes a run)"
        )
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
