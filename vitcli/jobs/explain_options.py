"""explain's options for the input-gradient methods and the audits: the baseline's choices, and their parts of a
result's name and settings (kept apart so vitcli/jobs/explain.py stays readable)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from vitcli.experiments.explain_options import AuditOptions, GradientOptions
from vitcli.naming import path_hash, safe_name, setting


class Baseline(StrEnum):
    gray = "gray"
    black = "black"
    blur = "blur"


def audit_name_parts(audits: AuditOptions, gradients: GradientOptions) -> list[str | None]:
    # The folder's name and a hash of where it is: two folders called `masks` are two settings.
    masks = None if audits.masks is None else f"{safe_name(audits.masks.name, 'masks')}-{path_hash(audits.masks, 8)}"
    parts = [setting("masks", masks)]
    if audits.robustness:
        parts += [setting("rob", gradients.samples), setting("r", audits.radius)]
    if audits.robustness or audits.road:
        parts.append(setting("ns", gradients.seed))
    parts.append("road" if audits.road else None)
    if audits.sanity:
        parts += [setting("san", audits.sanity_seed), setting("th", audits.sanity_threshold)]
    return parts


def audit_settings(audits: AuditOptions) -> dict[str, Any]:
    return {
        "masks": None if audits.masks is None else str(audits.masks),
        "robustness": audits.robustness,
        "radius": audits.radius,
        "road": audits.road,
        "sanity": audits.sanity,
        "sanity_seed": audits.sanity_seed,
        "sanity_threshold": audits.sanity_threshold,
    }
