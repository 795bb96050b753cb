"""`vitcli explain` as a library: its Job (settings, checks, name, computation, presentation) and the builder
that the command, `vitcli run` configs and the Python API call."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

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
from vitcli.jobs.explain_options import audit_name_parts, audit_settings
from vitcli.jobs.following import FollowsEmbedding
from vitcli.jobs.occlude import Fill
from vitcli.naming import result_name, setting
from vitcli.spec import MAX_RANDOM_ORDERS, check_count, check_seed
from vitcli.target_class import resolve_contrast, resolve_target_text
from vitcli.targets import EmbeddingTarget, parse_embedding_target

DEFAULT_STEPS = 49  # a quarter of the patches per step on the 14x14 grid; never more than the grid's patches

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
        self.target: int | None = None  # resolved by check()
        self.contrast: int | None = None

    def check(self, architecture: Any) -> None:
        depth, patches = architecture.depth, architecture.map_grid.num_patches
        if self.block is None:
            self.block = depth
        if not 1 <= self.block <= depth:
            raise UsageError(f"--block must be between 1 and {depth} (the model's blocks), not {self.block}")
        if architecture.staged:
            refuse_on_stages(self.methods, self.block, architecture)
        if self.faithfulness:
            if self.steps is None:
                self.steps = min(DEFAULT_STEPS, patches)
            if not 1 <= self.steps <= patches:
                raise UsageError(f"--steps must be between 1 and {patches} (the patches), not {self.steps}")
        if self.embedding_target is not None:
            self.embedding_target.check(architecture)
        self.target = resolve_target_text(architecture, self.target_text)
        self.contrast = resolve_contrast(architecture.labels, self.contrast_text, self.target)

    def uses(self) -> tuple[str, ...]:
        """explain's row of the support table, and the row of each method that needs more of the model."""
        needing = [method for method in self.methods if EXPLAIN_METHODS[method].needs is not None]
        return ("explain", *(f"explain --method {method}" for method in needing))

    def name(self) -> str:
        reads_block = READS_BLOCK_METHODS & set(self.methods)
        covers = bool(COVERING_METHODS & set(self.methods)) or self.faithfulness
        parts = [
            setting("m", self.methods),
            setting("b", self.block) if reads_block else None,
            self.fill if covers else None,
            self.target_name_part(),
            setting("c", self.contrast) if self.contrast is not None else None,
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
            parts += [setting("f", self.steps), setting("r", self.random_orders), setting("o", self.order_seed)]
        return result_name("explain", *parts)

    def settings(self) -> dict[str, Any]:
        return {
            "methods": self.methods,
            "target": self.target,
            **self.embedding_settings(),
            "block": self.block,
            "fill": self.fill,
            "faithfulness": self.faithfulness,
            "steps": self.steps,
            "random_orders": self.random_orders,
            "order_seed": self.order_seed,
            "contrast": self.contrast,
            "ig_steps": self.gradients.ig_steps,
            "baseline": self.gradients.baseline,
            "samples": self.gradients.samples,
            "noise": self.gradients.noise,
            "noise_seed": self.gradients.seed,
            **audit_settings(self.audits),
        }

    def compute(self, work: ImageWork) -> Any:
        return self.explain_image(work, self.target)

    def explain_image(self, work: ImageWork, target: int | None) -> Any:
        """The maps and audits of one image for class `target` (None: the clean top-1), as the settings say."""
        from vitcli.experiments.explain import MapSettings, count_work, explain
        from vitcli.experiments.explain_audits import audit, count_audit_work
        from vitcli.experiments.faithfulness import FaithfulnessOptions

        options = FaithfulnessOptions(self.steps, self.random_orders, self.order_seed) if self.faithfulness else None
        total = count_work(work.model, self.methods, options, self.gradients)
        if self.audits.any:
            settings = MapSettings(self.block or work.model.depth, self.fill, gradients=self.gradients)
            total += count_audit_work(work.model, self.methods, settings, self.audits)
        if total:
            work.steps.start(total, f"explaining {work.image.source.display_name}")
        embedding = self.bound_target(work.model)
        result = explain(
            work.model,
            work.image,
            self.methods,
            None if target is None else str(target),
            self.block,
            self.fill,
            faithfulness=options,
            on_progress=work.steps.advance,
            clean_logits=None if embedding is not None else work.clean_logits(),
            contrast=None if self.contrast is None else str(self.contrast),
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
def explain_jobs(
    method: list[str] | None = None,
    target: str | None = None,
    block: int | None = None,
    fill: str = "gray",
    faithfulness: bool = False,
    steps: int | None = None,
    random_orders: int = 5,
    order_seed: int = 0,
    contrast: str | None = None,
    ig_steps: int = DEFAULT_IG_STEPS,
    baseline: str = "gray",
    samples: int = DEFAULT_SAMPLES,
    noise: float = DEFAULT_NOISE,
    noise_seed: int = 0,
    masks: str | None = None,
    robustness: bool = False,
    radius: float = DEFAULT_RADIUS,
    road: bool = False,
    sanity: bool = False,
    sanity_seed: int = 0,
    sanity_threshold: float = DEFAULT_SANITY_THRESHOLD,
    target_image: str | None = None,
    target_direction: str | None = None,
    target_feature: int | None = None,
    target_text: str | None = None,
    contrast_text: str | None = None,
) -> list[Job]:
    embedding = parse_embedding_target(
        target, target_image, target_direction, target_feature, contrast, target_text, contrast_text
    )
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
