"""The audits of explain's maps, run after them on the same image: localisation against a mask (--masks),
robustness (--robustness), ROAD (--road) and the sanity checks (--sanity)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vitcli.experiments.explain import Explanation, MapSettings
from vitcli.experiments.explain_options import AuditOptions
from vitcli.model import PreparedImage, VitModel
from vitcli.targets import BoundTarget


def count_audit_work(model: VitModel, methods: list[str], settings: MapSettings, options: AuditOptions) -> int:
    """Steps the audits report through on_progress: the maps' own progress (occlusion covers, pixel-method
    backwards) per perturbation, ROAD's imputed forwards, one per sanity step."""
    from vitcli.experiments.explain import count_work
    from vitcli.experiments.road import PERCENTS
    from vitcli.experiments.sanity import count_steps

    per_map_set = count_work(model, methods, None, settings.gradients)
    return (
        (settings.gradients.samples * per_map_set if options.robustness else 0)
        + (2 * len(PERCENTS) * len(methods) if options.road else 0)
        + (count_steps(model.depth) if options.sanity else 0)
    )


@dataclass
class Audits:
    localisation: Any = None  # localisation.Localisation
    robustness: Any = None  # robustness.Robustness
    road: Any = None  # road.Road
    sanity: Any = None  # sanity.Sanity


def audit(
    model: VitModel,
    prepared: PreparedImage,
    result: Explanation,
    settings: MapSettings,
    options: AuditOptions,
    on_progress: Callable[[int], None] | None = None,
    embedding: BoundTarget | None = None,
) -> Audits:
    """The asked audits of an explanation's maps (recomputed with the same settings where an audit needs them);
    `embedding`: the embedding target the maps explain, if they follow one (sanity's random class needs a class)."""
    audits = Audits()
    maps = [(item.method, item.values) for item in result.maps]
    if options.masks is not None:
        from vitcli.experiments.localisation import localise

        audits.localisation = localise(model, prepared, options.masks, maps)
    target = embedding if embedding is not None else result.target.index
    samples, seed = settings.gradients.samples, settings.gradients.seed
    if options.robustness:
        from vitcli.experiments.robustness import robustness

        audits.robustness = robustness(
            model, prepared, result.maps, target, settings, options.radius, samples, seed, on_progress
        )
    if options.road:
        from vitcli.experiments.road import road

        audits.road = road(
            model,
            prepared.input,
            dict(maps),
            target,
            seed,
            clean_probability=result.target.score if embedding is not None else result.target.probability,
            on_progress=on_progress,
        )
    if options.sanity:
        from vitcli.experiments.explain import method_maps
        from vitcli.experiments.sanity import sanity

        methods = [item.method for item in result.maps]

        def compute(class_index: int) -> dict:
            maps, _ = method_maps(model, prepared, methods, class_index, settings)
            return {item.method: item.values for item in maps}

        audits.sanity = sanity(
            model, compute, dict(maps), target, options.sanity_seed, options.sanity_threshold, on_progress
        )
    return audits
