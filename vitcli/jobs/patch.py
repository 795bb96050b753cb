"""`vitcli patch` as a library: PatchJob, the pair CLEAN and CORRUPT that the command computes itself, and
PatchIntoJob, which the builder makes for `vitcli run` configs and the Python API (each image, a CLEAN, patched
into one CORRUPT); and the check of the command's two images."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from vitcli.errors import UsageError, VitcliError
from vitcli.jobs import ImageWork, Job, Presentation, SetImages, Steps, builds_jobs
from vitcli.jobs.following import FollowsEmbedding, TargetOption, TargetPlan, follows_embedding_target
from vitcli.naming import image_subject, result_name, set_subject, setting
from vitcli.target_class import resolve_target_text
from vitcli.targets import EmbeddingTarget


class SiteKind(str, Enum):
    residual = "residual"
    attention = "attention"
    mlp = "mlp"
    heads = "heads"


class Method(str, Enum):
    activation = "activation"
    attribution = "attribution"


class PatchJob(FollowsEmbedding, Job):
    """One result about an ordered pair of images (CLEAN, CORRUPT) as `vitcli patch CLEAN CORRUPT` computes it: the
    command runs the pair and files the result under the pair's folder. The job holds one image of the pair, its
    `partner`: here CLEAN; in PatchIntoJob (a `vitcli run` experiment), CORRUPT."""

    command = "patch"
    scope = "set"  # the pair (CLEAN, CORRUPT), in that order
    holds_every_image = True  # both, of course
    partner_role = "clean"
    name_prefix = "from"

    def __init__(
        self,
        partner: Path,
        target: str | None,
        contrast: str | None,
        sites: list[str],
        methods: list[str],
        embedding: EmbeddingTarget | None = None,
        planned: TargetPlan | None = None,
    ):
        self.embedding_target = embedding
        self.partner = partner
        self.target_text, self.contrast_text = target, contrast
        self.sites = [kind.value for kind in SiteKind if kind.value in sites]  # canonical order, once each
        self.methods = [method.value for method in Method if method.value in methods]
        self._planned = planned

    def plan(self, architecture: Any) -> PatchJob:
        from vitcli.loading import require_pre_norm
        from vitcli.target_class import resolve_contrast

        if self.embedding_target is not None:
            self.embedding_target.check(architecture)
        target = resolve_target_text(architecture, self.target_text)
        planned = TargetPlan(target, resolve_contrast(architecture.labels, self.contrast_text, target))
        require_pre_norm(architecture.name)
        return self.planned_as(planned)

    def planned_as(self, planned: TargetPlan) -> PatchJob:
        """This job with its plan, new (a PatchIntoJob stays one)."""
        given = (self.partner, self.target_text, self.contrast_text, self.sites, self.methods, self.embedding_target)
        return type(self)(*given, planned)

    def name(self) -> str:
        return result_name(
            "patch",
            f"{self.name_prefix}-{image_subject(self.partner)}",
            *self._target_parts(),
            setting("s", self.sites),
            setting("m", self.methods),
        )

    def _target_parts(self) -> list[str | None]:
        if self.embedding_target is not None:
            return [self.target_name_part()]
        contrast = self.planned.contrast
        return [self.target_name_part(), setting("c", "auto" if contrast is None else contrast)]

    def settings(self) -> dict[str, Any]:
        if self.embedding_target is not None:
            return {
                self.partner_role: str(self.partner),
                **self.embedding_settings(),
                "sites": self.sites,
                "methods": self.methods,
            }
        return {
            self.partner_role: str(self.partner),
            "target": self.planned.target if self.planned.target is not None else "CLEAN's top-1",
            "contrast": (
                self.planned.contrast
                if self.planned.contrast is not None
                else "CORRUPT's top-1 (its second if the target)"
            ),
            "sites": self.sites,
            "methods": self.methods,
        }

    def check_images(self, count: int) -> None:
        if count != 2:
            raise UsageError(f"patch needs exactly two images, CLEAN then CORRUPT; got {count}")

    def compute_set(self, model: Any, paths: SetImages, steps: Any) -> Any:
        """The pair as `vitcli patch CLEAN CORRUPT` runs it: `paths` are CLEAN (the job's partner) and CORRUPT."""
        from vitcli.experiments.patching import patch_images

        clean, corrupt = (paths.prepare(model, path) for path in paths)
        return patch_images(
            model,
            clean,
            corrupt,
            self.sites,
            self.methods,
            self.planned.target,
            self.planned.contrast,
            steps,
            embedding=self.bound_target(model),
        )

    def subject_of(self, result: Any) -> dict[str, Any]:
        return {"clean": result.clean.source.to_json(), "corrupt": result.corrupt.source.to_json()}

    def present(self, result: Any) -> Presentation:
        from vitcli.presentation import patch as view

        return Presentation.of(view, result)


class PatchIntoJob(PatchJob):
    """`vitcli run`'s patch: each image of the run is CLEAN, patched into one fixed CORRUPT (the config's `corrupt`).
    CORRUPT is prepared and run once per process, on its first image, and kept on the job for the others."""

    scope = "image"
    partner_role = "corrupt"
    name_prefix = "into"

    def __init__(
        self,
        corrupt: Path,
        target: str | None,
        contrast: str | None,
        sites: list[str],
        methods: list[str],
        embedding: EmbeddingTarget | None = None,
        planned: TargetPlan | None = None,
    ):
        super().__init__(corrupt, target, contrast, sites, methods, embedding, planned)
        self._corrupt: tuple[Any, Any] | None = None  # (PreparedImage, CorruptForward), on the first image

    def check_images(self, count: int) -> None:
        """Any number of images: each is one CLEAN (not the pair's two)."""

    def compute(self, work: ImageWork) -> Any:
        from vitcli.experiments.patching import corrupt_forward, patch_images

        if self._corrupt is None:
            corrupt = work.model.prepare(self.partner)
            gradients = "attribution" in self.methods
            embedding = self.bound_target(work.model)
            self._corrupt = corrupt, corrupt_forward(work.model, corrupt.input, gradients, embedding)
        corrupt, forward = self._corrupt
        if work.image.source.sha256 == corrupt.source.sha256:
            raise VitcliError(
                f"this image is CORRUPT ({self.partner}, the same bytes): M_clean = M_corrupt, so the score is "
                "undefined; patch only other images into it"
            )
        return patch_images(
            work.model,
            work.image,
            corrupt,
            self.sites,
            self.methods,
            self.planned.target,
            self.planned.contrast,
            work.steps,
            forward,
            embedding=self.bound_target(work.model),
        )


ContrastOption = Annotated[
    str | None,
    typer.Option(
        "--contrast",
        help="The class subtracted in M = logit(target) - logit(contrast): an index or a label. Default: "
        "CORRUPT's top-1, or its second when that is the target.",
        show_default=False,
    ),
]

SitesOption = Annotated[
    list[SiteKind] | None,
    typer.Option(
        "--sites",
        "-s",
        help="Where to patch, repeatable: residual (one row entering a block; blocks x tokens forwards), "
        "attention, mlp (a block's output), heads (one head's slice of attn.proj's input). Default: all four.",
        show_default=False,
    ),
]

MethodOption = Annotated[
    list[Method] | None,
    typer.Option(
        "--method",
        help="activation: one patched forward per site; attribution: the first-order estimate "
        "(a_clean - a_corrupt) . dM/da from 2 forwards and 1 backward. Repeat for both (and their correlation). "
        "Default: activation.",
        show_default=False,
    ),
]


class NamedPairJob(PatchJob):
    """The command line's pair named in a `vitcli run` config (`clean` and `corrupt`) or the API: about its own two
    images, not the run's, so computed once per run (scope "model", like probe's data folder) and filed where
    `vitcli patch CLEAN CORRUPT` files it, in the pair's folder."""

    scope = "model"

    def __init__(
        self,
        clean: Path,
        corrupt: Path,
        target: str | None,
        contrast: str | None,
        sites: list[str],
        methods: list[str],
        embedding: EmbeddingTarget | None = None,
        planned: TargetPlan | None = None,
    ):
        super().__init__(clean, target, contrast, sites, methods, embedding, planned)
        self.corrupt = corrupt

    def planned_as(self, planned: TargetPlan) -> PatchJob:
        given = (self.target_text, self.contrast_text, self.sites, self.methods, self.embedding_target)
        return NamedPairJob(self.partner, self.corrupt, *given, planned)

    def check_images(self, count: int) -> None:
        """Any number of images: the run's images are not its pair."""

    def once_subject(self) -> str | None:
        return set_subject([self.partner, self.corrupt])

    def compute_once(self, model: Any) -> Any:
        return self.compute_set(model, SetImages([self.partner, self.corrupt]), Steps())


@builds_jobs("patch")
@follows_embedding_target
def patch_jobs(
    clean: str | None = None,
    corrupt: str | None = None,
    target: TargetOption = None,
    contrast: ContrastOption = None,
    sites: SitesOption = None,
    method: MethodOption = None,
    *,
    embedding: EmbeddingTarget | None = None,
) -> list[Job]:
    """A `vitcli run` experiment: every image of the run patched into `corrupt` (one image file; a config reads it
    relative to its own folder); with `clean` as well, the command line's pair, once (NamedPairJob)."""
    if corrupt is None:
        raise UsageError(
            "patch in a config needs `corrupt = IMAGE`: the one CORRUPT image every image of the run (each a CLEAN) "
            "is patched into"
        )
    for role, path in (("clean", clean), ("corrupt", corrupt)):
        if path is not None and not Path(path).is_file():
            raise UsageError(
                f"{role} {path} is not an image file (patch takes one {role.upper()} image: not a folder or a glob)"
            )
    chosen = (*_chosen(sites, method), embedding)
    if clean is not None:
        return [NamedPairJob(*clean_and_corrupt([clean, corrupt]), target, contrast, *chosen)]
    return [PatchIntoJob(Path(corrupt), target, contrast, *chosen)]


@follows_embedding_target
def patch_pair_job(
    pair: list[str] | None,
    target: TargetOption = None,
    contrast: ContrastOption = None,
    sites: SitesOption = None,
    method: MethodOption = None,
    *,
    embedding: EmbeddingTarget | None = None,
) -> PatchJob:
    """The command line's form, `vitcli patch CLEAN CORRUPT` (and vitcli.patch): one PatchJob about the pair."""
    clean, _ = clean_and_corrupt(pair)
    return PatchJob(clean, target, contrast, *_chosen(sites, method), embedding)


def _chosen(sites: list[SiteKind] | None, method: list[Method] | None) -> tuple[list[str], list[str]]:
    """The sites and methods asked for as text, or the defaults: every site, activation patching."""
    chosen_sites = [str(getattr(kind, "value", kind)) for kind in (sites or list(SiteKind))]
    chosen_methods = [str(getattr(each, "value", each)) for each in (method or [Method.activation])]
    return chosen_sites, chosen_methods


def clean_and_corrupt(arguments: list[str] | None) -> tuple[Path, Path]:
    """CLEAN and CORRUPT: two arguments, each one image file, not the same file."""
    from vitcli.hashing import file_sha256
    from vitcli.images import resolve_images

    given = list(arguments or [])
    if len(given) != 2:
        listed = f": {', '.join(given)}" if given else ""
        raise UsageError(f"patch needs exactly two images, CLEAN then CORRUPT; got {len(given)}{listed}")
    paths = []
    for role, argument in zip(("CLEAN", "CORRUPT"), given, strict=True):
        found = resolve_images([argument])
        if len(found) != 1:
            raise UsageError(f"{role} must be one image file, but {argument} holds {len(found)} images")
        paths.append(found[0])
    clean, corrupt = paths
    if clean.resolve() == corrupt.resolve() or file_sha256(clean) == file_sha256(corrupt):
        raise UsageError(
            f"CLEAN and CORRUPT are the same image ({clean}, {corrupt}): M_clean = M_corrupt, so the score "
            "(M_patched - M_corrupt) / (M_clean - M_corrupt) is undefined; give two different images"
        )
    return clean, corrupt
