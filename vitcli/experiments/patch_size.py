"""compare-patch-size: one architecture at several patch sizes, counted, optionally measured and adapted.

The counts (`patch_size_variants`) need neither an image nor weights. The saved checkpoint was trained at one patch
size, so the comparison is architectural; `--measure` times random-init variants (`patch_size_measure`) and
`--adapt` resamples the checkpoint itself to each patch size (`patch_size_adapt`): adapted, not retrained.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from vitcli.experiments.patch_size_adapt import ADAPTED_NOTE, AdaptedPrediction, AdaptedRun, adapt_and_predict
from vitcli.experiments.patch_size_measure import Measurement, MeasureSettings, measure_variants
from vitcli.experiments.patch_size_variants import Dimensions, MacCount, Variant, count_variant
from vitcli.model import PreparedImage, VitModel

ARCHITECTURE_ONLY = "none (architecture only)"


def comparison_note(native_patch: int) -> str:
    return f"architectural comparison: the checkpoint was trained at patch {native_patch}"


@dataclass
class PatchSizeRow:
    variant: Variant
    closed_form: MacCount
    counted: MacCount  # FlopCounterMode's FLOPs / 2
    parameters: int
    measurement: Measurement | None = None
    adapted: AdaptedPrediction | None = None

    @property
    def relative_difference(self) -> float:
        """(FlopCounterMode MACs - closed-form MACs) / closed-form MACs."""
        return (self.counted.total - self.closed_form.total) / self.closed_form.total


@dataclass
class PatchSizeComparison:
    dimensions: Dimensions
    image_size: int
    pad: bool  # some patch size needed zero padding
    entries: list[PatchSizeRow]  # smallest patch first
    weights: str  # the model weights' label, ARCHITECTURE_ONLY unless adapted
    device: str | None = None  # where the variants were measured
    threads: int | None = None
    adapted: AdaptedRun | None = None

    @property
    def note(self) -> str:
        return comparison_note(self.dimensions.native_patch)

    @property
    def native(self) -> PatchSizeRow:
        return next(row for row in self.entries if row.variant.patch_size == self.dimensions.native_patch)

    # -- ratios against the checkpoint's own patch size

    def ratio(self, row: PatchSizeRow, quantity: str) -> float:
        """A Variant property of the row divided by the same property at the native patch size."""
        return getattr(row.variant, quantity) / getattr(self.native.variant, quantity)

    def mac_ratio(self, row: PatchSizeRow) -> float:
        return row.closed_form.total / self.native.closed_form.total

    def latency_ratio(self, row: PatchSizeRow) -> float:
        return row.measurement.latency_ms_per_image / self.native.measurement.latency_ms_per_image

    def memory_ratio(self, row: PatchSizeRow) -> float:
        native = self.native.measurement.peak_memory_bytes
        return row.measurement.peak_memory_bytes / native if native else math.nan


def compare_patch_sizes(
    variants: list[Variant],
    measure: MeasureSettings | None = None,
    adapt: tuple[VitModel, PreparedImage] | None = None,
    progress: Callable[[str], None] = lambda text: None,
) -> PatchSizeComparison:
    """Closed-form and FlopCounterMode counts for every variant (no image, no weights); with `measure`, latency
    and peak memory of random-init variants on the device; with `adapt`, the checkpoint resampled to each patch
    size and run on the image."""
    rows = []
    for variant in variants:
        progress(f"counting patch {variant.patch_size} ...")
        rows.append(PatchSizeRow(variant, variant.macs(), *count_variant(variant)))
    comparison = PatchSizeComparison(
        variants[0].dimensions,
        variants[0].image_size,
        any(variant.padding for variant in variants),
        rows,
        ARCHITECTURE_ONLY,
    )
    if measure is not None:
        comparison.device, comparison.threads = str(measure.device), torch.get_num_threads()
        for row, measurement in zip(rows, measure_variants(variants, measure, progress), strict=True):
            row.measurement = measurement
    if adapt is not None:
        model, prepared = adapt
        progress(f"adapting the checkpoint to each patch size ({ADAPTED_NOTE}) ...")
        comparison.adapted = adapt_and_predict(model, variants, prepared)
        for row in rows:
            row.adapted = comparison.adapted.predictions[row.variant.patch_size]
        comparison.weights = model.spec.label
    return comparison
