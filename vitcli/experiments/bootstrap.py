"""The mean of per-image scores with a percentile bootstrap interval (Efron and Tibshirani 1993, ch. 13).

B resamples of the n scores, drawn with replacement by numpy's default generator seeded with `seed`
(`rng.integers(0, n, (B, n))`, the draws scipy.stats.bootstrap makes from the same generator); the interval is the
(1 - confidence) / 2 and (1 + confidence) / 2 quantiles of the B resampled means (numpy's linear interpolation).
One score gives an interval of width 0; absent scores (None, NaN) are left out and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vitcli.errors import UsageError

DEFAULT_RESAMPLES = 1000
DEFAULT_CONFIDENCE = 0.95


@dataclass(frozen=True)
class BootstrapInterval:
    mean: float  # of the scores themselves (not of the resampled means)
    low: float
    high: float
    n: int  # scores used
    absent: int  # scores left out (None or NaN)
    resamples: int
    confidence: float
    seed: int


def bootstrap_interval(
    scores: Sequence[float | None],
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
) -> BootstrapInterval | None:
    """Mean and percentile bootstrap interval of the scores; None when no score is present."""
    if resamples < 1:
        raise UsageError(f"bootstrap resamples must be at least 1, not {resamples}")
    if not 0 < confidence < 1:
        raise UsageError(f"bootstrap confidence must be between 0 and 1, not {confidence}")
    if seed < 0:
        raise UsageError(f"bootstrap seed must be at least 0, not {seed}")
    values = np.array([np.nan if score is None else float(score) for score in scores], dtype=np.float64)
    present = values[~np.isnan(values)]
    if present.size == 0:
        return None
    generator = np.random.default_rng(seed)
    means = present[generator.integers(0, present.size, (resamples, present.size))].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return BootstrapInterval(
        float(present.mean()),
        float(low),
        float(high),
        int(present.size),
        int(values.size - present.size),
        resamples,
        confidence,
        seed,
    )
