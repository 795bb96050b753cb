"""`vitcli explain` as a library: its Job (settings, plan, name, computation, presentation) and the builder
that the command, `vitcli run` configs and the Python API call."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from vitcli.errors import UsageError
from vitcli.experiments.explain_options import (
    DEFAULT_IG_STEPS,
    DEFAULT_NOISE,
    DEFAULT_RADIUS,
    DEFAULT_SAMPLES,
    DEFAULT_SANITY_THRESHOLD,
    AuditOptions,
    GradientOptions,
    check_audit_options,
    check_gradient_options,
)
from vitcli.explain_methods import (
    ACROSS_BLOCKS_METHODS,
    CONTRAST_METHODS,
    COVERING_METHODS,
    DEFAULT_METHODS,
    EXPLAIN_METHODS,
    METHOD_NAMES,
    READS_BLOCK_METHODS,
)
from vitcli.jobs import ImageWork, Job, Presentation, builds_jobs
from vitcli.jobs.explain_options import (
    DEFAULT_STEPS,
    Baseline,
    BaselineOption,
    ContrastOption,
    FaithfulnessOption,
    IgStepsOption,
    MasksOption,
    NoiseOption,
    NoiseSeedOption,
    OrderSeedOption,
    RadiusOption,
    RandomOrdersOption,
    RoadOption,
    RobustnessOption,
    SamplesOption,
    SanityOption,
    SanitySeedOption,
    SanityThresholdOption,
    StepsOption,
    audit_name_parts,
    audit_settings,
)
from vitcli.jobs.following import FollowsEmbedding, TargetOption, follows_embedding_target
from vitcli.jobs.occlude import Fill
from vitcli.naming import result_name, setting
from vitcli.spec import MAX_RANDOM_ORDERS, check_count, check_seed
from vitcli.target_class import resolve_contrast, resolve_target_text
from vitcli.targets import EmbeddingTarget

# The command's choices, from the registry (vitcli.explain_methods); occlusion runs one forward per patch, so it is
# asked for, not a default.
Method = StrEnum("Method", {name.replace("-", "_"): name for name in METHOD_NAMES})


def refuse_on_stages(methods: list[str], block: int, architecture: Any) -> None:
    """What a model of stages with their own grids (Swin) cannot explain: attention carried across blocks, the CLS
    query's attention, Grad-CAM off the last stage's grid (the one every map is drawn on)."""
    across = [method for method in ACROSS_BLOCKS_METHODS if method in methods]
    if across:
        raise UsageError(
            f"--method {across[0]}: rollout multiplies attention across blocks on one token grid; Swin's stages "
            "have different grids"
        )
    if "attention" in methods:
        raise UsageError(f"--method attention shows the CLS query's attention; {architecture.name} has no class token")
    last = [place.number for place in architecture.places if place.grid == architecture.map_grid]
    if "gradcam" in methods and block not in last:
        grid = architecture.map_grid
        raise UsageError(
            f"--block {block}: Grad-CAM on {architecture.name} reads a block of the last stage, whose "
            f"{grid.rows}x{grid.cols} grid every map is drawn on: {last[0]}..{last[-1]}"
        )


@dataclass(frozen=True)
class ExplainPlan:
    """An explain job's block, steps and classes resolved against the model (ExplainJob.plan)."""

    block: int  # --block, or the last block
    steps: int | None  # --steps of the faithfulness curves, or their default fitted to the patches; None without them
    target: int | None  # None: each image's clean top-1
    contrast: int | None


class ExplainJob(FollowsEmbedding, Job):
    command = "explain"

    def __init__(
        self,
        methods: list[str],
        target: str | None,
        block: int | None,
        fill: str,
        faithfulness: bool,
        steps: int | None,
        random_orders: int,
        order_seed: int,
        contrast: str | None = None,
        gradients: GradientOptions | None = None,
        audits: AuditOptions | None = None,
        embedding: EmbeddingTarget | None = None,
        planned: ExplainPlan | None = None,
    ):
        self.embedding_target = embedding
        self.methods = methods
        self.target_text = target
        self.block = block
        self.fill = fill
        self.faithfulness = faithfulness
        self.steps = steps
        self.random_orders = random_orders
        self.order_seed = order_seed
        self.contrast_text = contrast
        self.gradients = gradients or GradientOptions()
        self.audits = audits or AuditOptions()
        self._planned = planned

    def plan(self, architecture: Any) -> ExplainJob:
        depth, patches = architecture.depth, architecture.map_grid.num_patches
        block = depth if self.block is None else self.block
        if not 1 <= block <= depth:
            raise UsageError(f"--block must be between 1 and {depth} (the model's blocks), not {block}")
        if architecture.staged:
            refuse_on_stages(self.methods, block, architecture)
        steps = None
        if self.faithfulness:
            steps = min(DEFAULT_STEPS, patches) if self.steps is None else self.steps
            if not 1 <= steps <= patches:
                raise UsageError(f"--steps must be between 1 and {patches} (the patches), not {steps}")
        if self.embedding_target is not None:
            self.embedding_target.check(architecture)
        target = resolve_target_text(architecture, self.target_text)
        contrast = resolve_contrast(architecture.labels, self.contrast_text, target)
        return ExplainJob(
            self.methods,
            self.target_text,
            self.block,
            self.fill,
            self.faithfulness,
            self.steps,
            self.random_orders,
            self.order_seed,
            self.contrast_text,
            self.gradients,
            self.audits,
            self.embedding_target,
            ExplainPlan(block, steps, target, contrast),
        )

    def uses(self) -> tuple[str, ...]:
        """explain's row of the support table, and the row of each method that needs more of the model."""
        needing = [method for method in self.methods if EXPLAIN_METHODS[method].needs is not None]
        return ("explain", *(f"explain --method {method}" for method in needing))

    def name(self) -> str:
        planned = self.planned
        reads_block = READS_BLOCK_METHODS & set(self.methods)
        covers = bool(COVERING_METHODS & set(self.methods)) or self.faithfulness
        parts = [
            setting("m", self.methods),
            setting("b", planned.block) if reads_block else None,
            self.fill if covers else None,
            self.target_name_part(),
            setting("c", planned.contrast) if planned.contrast is not None else None,
        ]
        if "ig" in self.methods:
            parts += [setting("ig", self.gradients.ig_steps), self.gradients.baseline]
        if "smoothgrad" in self.methods:
            parts += [setting("n", self.gradients.samples), setting("s", self.gradients.noise)]
        if ("smoothgrad" in self.methods or "random" in self.methods) and not (
            self.audits.robustness or self.audits.road
        ):
            parts.append(setting("ns", self.gradients.seed))  # the audits' parts carry it otherwise
        parts += audit_name_parts(self.audits, self.gradients)
        if self.faithfulness:
            parts += [setting("f", planned.steps), setting("r", self.random_orders), setting("o", self.order_seed)]
        return result_name("explain", *parts)

    def settings(self) -> dict[str, Any]:
        planned = self.planned
        return {
            "methods": self.methods,
            "target": planned.target,
            **self.embedding_settings(),
            "block": planned.block,
            "fill": self.fill,
            "faithfulness": self.faithfulness,
            "steps": planned.steps,
            "random_orders": self.random_orders,
            "order_seed": self.order_seed,
            "contrast": planned.contrast,
            "ig_steps": self.gradients.ig_steps,
            "baseline": self.gradients.baseline,
            "samples": self.gradients.samples,
            "noise": self.gradients.noise,
            "noise_seed": self.gradients.seed,
            **audit_settings(self.audits),
        }

    def compute(self, work: ImageWork) -> Any:
        return self.explain_image(work, self.planned.target, self.methods)

    def explain_image(self, work: ImageWork, target: int | None, methods: list[str]) -> Any:
        """The maps and audits of one image by `methods` for class `target` (None: the clean top-1), with the other
        settings as planned."""
        from vitcli.experiments.explain import MapSettings, count_work, explain
        from vitcli.experiments.explain_audits import audit, count_audit_work
        from vitcli.experiments.faithfulness import FaithfulnessOptions

        planned = self.planned
        options = FaithfulnessOptions(planned.steps, self.random_orders, self.order_seed) if self.faithfulness else None
        total = count_work(work.model, methods, options, self.gradients)
        if self.audits.any:
            settings = MapSettings(planned.block, self.fill, gradients=self.gradients)
            total += count_audit_work(work.model, methods, settings, self.audits)
        if total:
            work.steps.start(total, f"explaining {work.image.source.display_name}")
        embedding = self.bound_target(work.model)
        result = explain(
            work.model,
            work.image,
            methods,
            None if target is None else str(target),
            planned.block,
            self.fill,
            faithfulness=options,
            on_progress=work.steps.advance,
            clean_logits=None if embedding is not None else work.clean_logits(),
            contrast=None if planned.contrast is None else str(planned.contrast),
            gradient_options=self.gradients,
            embedding=embedding,
        )
        if self.audits.any:
            contrast = None if result.contrast is None else result.contrast.index
            settings = MapSettings(result.block, self.fill, gradients=self.gradients, contrast=contrast)
            result.audits = audit(work.model, work.image, result, settings, self.audits, work.steps.advance, embedding)
        return result

    def present(self, result: Any) -> Presentation:
        from vitcli.presentation import explain as view
        from vitcli.presentation import explain_audit

        curves = {"curves.csv": view.curve_rows(result)} if result.faithfulness is not None else {}
        document = {**view.document(result), "arrays": explain_audit.arrays_json(result, self.name())}
        return Presentation(
            view.table(result),
            view.rows(result),
            document,
            figure=lambda: view.figure(result),
            extra_files={**curves, **explain_audit.audit_files(result)},
            summary=view.summary(result),
        )

    @classmethod
    def present_across_images(cls, documents: list[dict[str, Any]]) -> Presentation | None:
        """Over several images: each method's mean and spread of both faithfulness AUCs (with --faithfulness) and
        of every audit score, ranked per score; from the stored results' JSON bodies alone (the spread reads each
        method's and the random baseline's AUCs only)."""
        from types import SimpleNamespace as Stored

        from rich.console import Group

        from vitcli.experiments.faithfulness import faithfulness_spread
        from vitcli.presentation import explain as view
        from vitcli.presentation import explain_audit
        from vitcli.presentation.faithfulness import spread_figure

        def aucs(item: dict[str, Any], method: str | None = None) -> Stored:
            auc = [Stored(auc=float(item[key]["auc"])) for key in ("deletion", "insertion")]
            return Stored(method=method, deletion=auc[0], insertion=auc[1])

        curves = [
            Stored(
                methods=[aucs(item, item["method"]) for item in body["faithfulness"]["methods"]],
                random=aucs(body["faithfulness"]["random"]) if body["faithfulness"].get("random") else None,
            )
            for body in documents
            if body.get("faithfulness")
        ]
        ranking = explain_audit.score_ranking(documents)
        if not curves and not ranking:
            return None
        spreads = faithfulness_spread(curves)  # type: ignore[arg-type]
        tables = ([view.spread_table(spreads)] if curves else []) + (
            [explain_audit.ranking_table(ranking)] if ranking else []
        )
        document: dict[str, Any] = {"images": len(documents)}
        if curves:
            document |= {"images": len(curves), "methods": view.spread_rows(spreads)}
        if ranking:
            document["audit_scores"] = ranking
        weights = documents[0]["weights"]
        figure = (lambda: spread_figure(spreads, weights)) if curves else None
        return Presentation(Group(*tables), view.spread_rows(spreads) + ranking, document, figure=figure)


@builds_jobs("explain")
@follows_embedding_target
def explain_jobs(
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
    faithfulness: FaithfulnessOption = False,
    steps: StepsOption = None,
    random_orders: RandomOrdersOption = 5,
    order_seed: OrderSeedOption = 0,
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
    *,
    embedding: EmbeddingTarget | None = None,
) -> list[Job]:
    if embedding is not None and sanity:
        raise UsageError(
            f"--sanity compares the maps with those of a random other class; it does not apply to {embedding.option}"
        )
    methods = list(dict.fromkeys(str(choice) for choice in method or DEFAULT_METHODS))
    unknown = [choice for choice in methods if choice not in METHOD_NAMES]
    if unknown:
        raise UsageError(f"unknown method {unknown[0]!r}: choose from {', '.join(METHOD_NAMES)}")
    if str(fill) not in {member.value for member in Fill}:
        raise UsageError(f"unknown fill {fill!r}: choose one of {', '.join(member.value for member in Fill)}")
    if not faithfulness and steps is not None:
        raise UsageError("--steps sets the faithfulness curves: add --faithfulness")
    check_count("--random-orders", random_orders, 0, MAX_RANDOM_ORDERS, "each costs 2 x --steps forwards per image")
    check_seed("--order-seed", order_seed)
    gradients = GradientOptions(ig_steps, str(baseline), samples, noise, noise_seed)
    check_gradient_options(gradients)
    audits = AuditOptions(
        None if masks is None else Path(masks), robustness, radius, road, sanity, sanity_seed, sanity_threshold
    )
    check_audit_options(audits)
    if contrast is not None and not set(CONTRAST_METHODS) & set(methods):
        raise UsageError(
            f"--contrast applies to the gradient methods and dla: add one of {', '.join(CONTRAST_METHODS)}"
        )
    return [
        ExplainJob(
            methods,
            target,
            block,
            str(fill),
            faithfulness,
            steps,
            random_orders,
            order_seed,
            contrast,
            gradients,
            audits,
            embedding,
        )
    ]
