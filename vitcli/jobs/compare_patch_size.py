"""`vitcli compare-patch-size` as a library: its Jobs (settings, plan, name, computation, presentation) and the
builder that the command, `vitcli run` configs and the Python API call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from vitcli.errors import UsageError
from vitcli.jobs import ImageWork, Job, Presentation, builds_jobs
from vitcli.naming import result_name, setting

# Upper bounds of the counts: a 4096-pixel side is 65,536 tokens at patch 16; 1,000 timed forwards give a steady
# median. Beyond them a typo would run for hours or exhaust memory before saying anything.
MAX_IMAGE_SIZE = 4096
MAX_RUNS = 1000


@dataclass(frozen=True)
class PatchSizePlan:
    """The variants compared, planned against the model's dimensions (PatchSizeJob.plan)."""

    dimensions: Any  # experiments.patch_size_variants.Dimensions
    variants: tuple[Any, ...]  # experiments.patch_size_variants.Variant, smallest patch first


class PatchSizeJob(Job):
    """The architecture at several patch sizes: counted (no weights), optionally timed; the variants are planned
    against the model's dimensions by plan()."""

    command = "compare-patch-size"
    needs_classes = False
    needs_weights = False  # random-init variants on the meta device (counts) or on the device (--measure)
    scope = "model"

    def __init__(
        self,
        patch_sizes: list[int],
        image_size: int | None,
        pad: bool,
        measure: bool,
        runs: int,
        warmup: int,
        planned: PatchSizePlan | None = None,
    ):
        self.patch_sizes = patch_sizes
        self.image_size, self.pad = image_size, pad
        self.measure, self.runs, self.warmup = measure, runs, warmup
        self._planned = planned
        self.progress: Callable[[str], None] = _silent  # "counting patch 8 ...": the command's stderr

    def plan(self, architecture: Any) -> PatchSizeJob:
        from vitcli.experiments.patch_size_variants import plan_variants, read_dimensions

        dimensions = read_dimensions(architecture.name)
        size = dimensions.native_image if self.image_size is None else self.image_size
        planned = PatchSizePlan(dimensions, tuple(plan_variants(dimensions, self.patch_sizes, size, self.pad)))
        given = (self.patch_sizes, self.image_size, self.pad, self.measure, self.runs, self.warmup)
        return type(self)(*given, planned)  # an AdaptedPatchSizeJob stays one

    @property
    def variants(self) -> list[Any]:
        return list(self.planned.variants)

    @property
    def dimensions(self) -> Any:
        return self.planned.dimensions

    @property
    def added_native(self) -> bool:
        """The checkpoint's own patch size was not asked for: every ratio needs it."""
        return self.dimensions.native_patch not in self.patch_sizes

    def name(self) -> str:
        variant = self.variants[0]
        measured = ["measure", setting("r", self.runs), setting("w", self.warmup)] if self.measure else []
        return result_name(
            "patch-sizes",
            setting("p", [variant.patch_size for variant in self.variants]),
            setting("i", variant.image_size),
            setting("pad", self.pad),
            *measured,
        )

    def settings(self) -> dict[str, Any]:
        chosen: dict[str, Any] = {
            "patch_sizes": [variant.patch_size for variant in self.variants],
            "image_size": self.variants[0].image_size,
            "pad": self.pad,
            "measure": self.measure,
        }
        return chosen | ({"runs": self.runs, "warmup": self.warmup} if self.measure else {})

    def measure_settings(self, device: Any, batch_size: int, seed: int) -> Any:
        """What --measure needs, or None without it."""
        from vitcli.experiments.patch_size_measure import MeasureSettings

        return MeasureSettings(device, batch_size, self.runs, self.warmup, seed) if self.measure else None

    def compute_once(self, model: Any) -> Any:
        """`model`: a loaded VitModel or a session's UnloadedModel; only its device, batch size and seed are read."""
        from vitcli.experiments.patch_size import compare_patch_sizes

        settings = self.measure_settings(model.device, model.batch_size, model.spec.seed)
        return compare_patch_sizes(self.variants, settings, progress=self.progress)

    def provenance(self, run: dict[str, Any]) -> dict[str, Any]:
        """The architecture and the software versions, not the weights (none are read): the same from the command,
        which loads none, as from a `vitcli run` or the API, which have them loaded."""
        from vitcli.experiments.patch_size import ARCHITECTURE_ONLY, comparison_note
        from vitcli.presentation.patch_size import dimensions_provenance

        return {
            **dimensions_provenance(self.dimensions),
            "weights_label": ARCHITECTURE_ONLY,
            "command": run["command"],
            "comparison": comparison_note(self.dimensions.native_patch),
        }

    def present(self, result: Any) -> Presentation:
        from vitcli.presentation import patch_size as view

        return Presentation.of(view, result)


class AdaptedPatchSizeJob(PatchSizeJob):
    """The same comparison with the checkpoint itself resampled to each patch size and run on one image."""

    needs_classes = True
    needs_weights = True
    scope = "image"

    def uses(self) -> tuple[str, ...]:
        return ("compare-patch-size --adapt",)

    def provenance(self, run: dict[str, Any]) -> dict[str, Any]:
        """The loaded checkpoint's, which the adapted predictions depend on."""
        return run

    def name(self) -> str:
        return result_name(super().name(), "adapted")

    def compute(self, work: ImageWork) -> Any:
        from vitcli.experiments.patch_size import compare_patch_sizes

        model = work.model
        settings = self.measure_settings(model.device, model.batch_size, model.spec.seed)
        return compare_patch_sizes(self.variants, settings, adapt=(model, work.image))


def _silent(text: str) -> None:
    """No progress lines: a run or the API, where only the command prints them."""


@builds_jobs("compare-patch-size")
def compare_patch_size_jobs(
    patch_sizes: Annotated[
        str,
        typer.Option(
            "--patch-sizes", "-p", help="Comma-separated patch sizes in pixels; the checkpoint's own is always added."
        ),
    ] = "8,16,32",
    image_size: Annotated[
        int | None,
        typer.Option(
            "--image-size",
            min=1,
            max=MAX_IMAGE_SIZE,
            help="Image side in pixels (default: the checkpoint's, 224).",
            show_default=False,
        ),
    ] = None,
    pad: Annotated[
        bool,
        typer.Option(
            "--pad",
            help="Allow patch sizes that do not divide the image: zero-pad right and bottom as timm's dynamic_img_pad.",
        ),
    ] = False,
    measure: Annotated[
        bool,
        typer.Option("--measure", help="Also time each variant (random init) on --device and measure its peak memory."),
    ] = False,
    runs: Annotated[
        int,
        typer.Option(
            "--runs", min=1, max=MAX_RUNS, help="Timed forwards per variant with --measure (the median is shown)."
        ),
    ] = 10,
    warmup: Annotated[
        int, typer.Option("--warmup", min=0, max=MAX_RUNS, help="Untimed forwards before timing with --measure.")
    ] = 2,
    adapt: Annotated[
        str | None,
        typer.Option(
            "--adapt",
            metavar="IMAGE",
            help="Resample the checkpoint to each patch size and run IMAGE (adapted, not retrained).",
            show_default=False,
        ),
    ] = None,
) -> list[Job]:
    """One job: about the model alone, or, with --adapt, about that image."""
    from vitcli.experiments.patch_size_variants import parse_patch_sizes

    if runs < 1 or warmup < 0:
        raise UsageError(f"--runs must be at least 1 and --warmup at least 0, not {runs} and {warmup}")
    kind = PatchSizeJob if adapt is None else AdaptedPatchSizeJob
    return [kind(parse_patch_sizes(patch_sizes), image_size, pad, measure, runs, warmup)]
