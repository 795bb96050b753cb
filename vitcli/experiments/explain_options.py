"""The settings of explain's pixel-gradient methods and audits, with their bounds; torch-free, so a command checks
them (exit 2) before any weights load."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vitcli.errors import UsageError

BASELINES = ("gray", "black", "blur")
MAX_IG_STEPS = 1024
MAX_SAMPLES = 1000
DEFAULT_IG_STEPS = 32
DEFAULT_SAMPLES = 10
DEFAULT_NOISE = 0.15  # Smilkov et al.: 10-20% of the input range works best
MAX_SEED = 2**63 - 1  # torch generators take seeds up to 2^64 - 1; one bound for every seed here


@dataclass(frozen=True)
class GradientOptions:
    ig_steps: int = DEFAULT_IG_STEPS
    baseline: str = "gray"
    samples: int = DEFAULT_SAMPLES  # SmoothGrad's noisy copies (and the robustness audit's perturbations)
    noise: float = DEFAULT_NOISE  # SmoothGrad's sigma as a fraction of the normalized input's range
    seed: int = 0  # SmoothGrad's noise (and the robustness audit's perturbations)


def check_gradient_options(options: GradientOptions) -> None:
    if not 2 <= options.ig_steps <= MAX_IG_STEPS:
        raise UsageError(f"--ig-steps must be between 2 and {MAX_IG_STEPS}, not {options.ig_steps}")
    if options.baseline not in BASELINES:
        raise UsageError(f"unknown --baseline {options.baseline!r}: choose one of {', '.join(BASELINES)}")
    if not 1 <= options.samples <= MAX_SAMPLES:
        raise UsageError(f"--samples must be between 1 and {MAX_SAMPLES}, not {options.samples}")
    if not 0 <= options.seed <= MAX_SEED:
        raise UsageError(f"--noise-seed must be between 0 and {MAX_SEED}, not {options.seed}")
    if not 0 < options.noise <= 1:
        raise UsageError(f"--noise must be above 0 and at most 1 (a fraction of the input range), not {options.noise}")


DEFAULT_RADIUS = 0.02  # of the normalized input's range, as captum's sensitivity_max default radius
MAX_RADIUS = 1.0
DEFAULT_SANITY_THRESHOLD = 0.5


@dataclass(frozen=True)
class AuditOptions:
    """Which audits of the maps to run beside them."""

    masks: Path | None = None  # --masks: a folder of segmentation masks, one per image stem
    robustness: bool = False  # max- and average-sensitivity over GradientOptions.samples perturbations
    radius: float = DEFAULT_RADIUS  # perturbation radius as a fraction of the normalized input's range
    road: bool = False
    sanity: bool = False
    sanity_seed: int = 0
    sanity_threshold: float = DEFAULT_SANITY_THRESHOLD

    @property
    def any(self) -> bool:
        return self.masks is not None or self.robustness or self.road or self.sanity


def check_audit_options(options: AuditOptions) -> None:
    if options.masks is not None and not options.masks.is_dir():
        raise UsageError(f"--masks {options.masks} is not a folder")
    if not 0 < options.radius <= MAX_RADIUS:
        raise UsageError(f"--radius must be above 0 and at most {MAX_RADIUS:g}, not {options.radius}")
    if not 0 <= options.sanity_seed <= MAX_SEED:
        raise UsageError(f"--sanity-seed must be between 0 and {MAX_SEED}, not {options.sanity_seed}")
    if not 0 < options.sanity_threshold < 1:
        raise UsageError(f"--sanity-threshold must be between 0 and 1, not {options.sanity_threshold}")
