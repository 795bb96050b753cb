"""`vitcli bench`'s numbers: which scores it measures, each image's scores read from explain's result body, the
pairing of images with their masks, and the leaderboard over images (mean and a 95% bootstrap interval per method and
score, ranked per score).

Torch-free: the leaderboard is computed from the stored per-image JSON bodies alone, so shards, resumed runs and
`vitcli merge` give the numbers a fresh run gives.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitcli.errors import UsageError, VitcliError
from vitcli.experiments.bootstrap import bootstrap_interval


@dataclass(frozen=True)
class Score:
    name: str  # the score's key in the JSON and CSV
    option: str  # the word of --scores that asks for it
    higher_better: bool
    needs_masks: bool = False
    what: str = ""


# In the leaderboard's order. Each option word asks for the scores that carry it.
SCORES = (
    Score("pointing_game", "pointing", True, True, "the map's largest patch lies on the object (share of images)"),
    Score("relevance_mass", "mass", True, True, "share of the positive map mass on the object"),
    Score(
        "relevance_mass_signed", "mass", True, True, "sum of the map on the object / sum of the map (Quantus's, signed)"
    ),
    Score("focus", "focus", True, False, "share of the positive map mass in the target's quadrants (mosaics only)"),
    Score("road_combined", "road", True, False, "ROAD: (mean LeRF - mean MoRF) / 2 over the imputed percentages"),
    Score("deletion_auc", "deletion", False, False, "deletion curve's area (most relevant patches covered first)"),
    Score("insertion_auc", "insertion", True, False, "insertion curve's area (most relevant patches revealed first)"),
    Score("sanity_spearman", "sanity", False, False, "|Spearman| between the map and the map of a randomised model"),
    Score("max_sensitivity", "sensitivity", False, False, "largest relative change of the map under small noise"),
)
SCORE_BY_NAME = {score.name: score for score in SCORES}
SCORE_OPTIONS = tuple(dict.fromkeys(score.option for score in SCORES))
# explain's names of the audit scores (vitcli.presentation.explain_audit.SCORES) that bench reports, by bench's name
FROM_AUDITS = {
    "pointing_game": "pointing_game",
    "relevance_mass": "mass_accuracy",
    "relevance_mass_signed": "mass_accuracy_signed",
    "focus": "focus",
    "road_combined": "road_combined",
    "sanity_spearman": "sanity_all_blocks_spearman_abs",
    "max_sensitivity": "max_sensitivity",
}
CONFIDENCE = 0.95
RESAMPLES = 2000
# Fixed, and the values sorted before resampling: the same values give the same interval in every run, shard and merge.
BOOTSTRAP_SEED = 0
MAX_SCENES = 100_000


def parse_scores(text: str | None) -> list[str]:
    """`--scores pointing,mass,...` as option words in the documented order; None or "all": every score."""
    if text is None or text.strip() == "all":
        return list(SCORE_OPTIONS)
    words = [word.strip() for word in text.split(",") if word.strip()]
    unknown = [word for word in words if word not in SCORE_OPTIONS]
    if unknown or not words:
        shown = repr(unknown[0]) if unknown else "nothing"
        raise UsageError(f"--scores {shown}: choose from {', '.join(SCORE_OPTIONS)} (comma-separated), or all")
    return [word for word in SCORE_OPTIONS if word in words]


def check_scenes(scenes: int | None, mosaics: int | None, seed: int) -> None:
    """The scene counts and seed, refused before the model loads."""
    for option, count in (("--scenes", scenes), ("--mosaics", mosaics)):
        if count is not None and not 1 <= count <= MAX_SCENES:
            raise UsageError(f"{option} must be between 1 and {MAX_SCENES} (scenes to generate), not {count}")
    if seed < 0:
        raise UsageError(f"--scene-seed must be 0 or more, not {seed}")


def image_scores(explained: dict[str, Any], methods: Sequence[str], scores: Sequence[str]) -> dict[str, dict]:
    """method -> score -> value of one image, read from explain's result body (booleans as 0/1); a score a method
    has no value of on this image (no positive mass) is left out."""
    from vitcli.presentation.explain_audit import audit_scores

    audited = audit_scores(explained)
    values: dict[str, dict[str, float]] = {method: {} for method in methods}
    for name, source in FROM_AUDITS.items():
        if name in scores:
            for method, value in audited.get(source, {}).items():
                values.setdefault(method, {})[name] = value
    for item in (explained.get("faithfulness") or {}).get("methods", []):
        for curve in ("deletion", "insertion"):
            if f"{curve}_auc" in scores:
                values.setdefault(item["method"], {})[f"{curve}_auc"] = float(item[curve]["auc"])
    return values


@dataclass
class LeaderboardRow:
    method: str
    score: str  # "" for a method that could not run
    images: int = 0
    mean: float | None = None
    low: float | None = None  # the 95% bootstrap interval of the mean
    high: float | None = None
    rank: int | None = None  # 1 = best mean of the score; equal means share the best rank
    reason: str = ""  # why the method has no scores


def leaderboard(documents: Sequence[dict[str, Any]]) -> list[LeaderboardRow]:
    """Per score and method over the images' bench bodies: mean, bootstrap interval (vitcli.experiments.bootstrap)
    and rank; then one row per method that could not run, with its reason (every image of a run has the same)."""
    values: dict[str, dict[str, list[float]]] = {}
    unavailable: dict[str, str] = {}
    for document in documents:
        bench = document.get("bench") or {}
        for method, scores in (bench.get("scores") or {}).items():
            for score, value in scores.items():
                values.setdefault(score, {}).setdefault(method, []).append(float(value))
        for method, reason in (bench.get("unavailable") or {}).items():
            unavailable.setdefault(method, reason)
    rows = []
    for score in (score for score in SCORE_BY_NAME if score in values):
        higher = SCORE_BY_NAME[score].higher_better
        means = {method: float(np.mean(listed)) for method, listed in values[score].items()}
        for method, listed in values[score].items():
            better = sum(1 for other in means.values() if other != means[method] and (other > means[method]) == higher)
            interval = bootstrap_interval(sorted(listed), RESAMPLES, CONFIDENCE, BOOTSTRAP_SEED)
            rows.append(
                LeaderboardRow(method, score, len(listed), means[method], interval.low, interval.high, better + 1)
            )
    rows.sort(key=lambda row: (list(SCORE_BY_NAME).index(row.score), row.rank, row.method))
    rows += [LeaderboardRow(method, "", reason=reason) for method, reason in unavailable.items()]
    return rows


@dataclass
class MaskedImages:
    kept: list[Path]  # images with a mask of their own size
    missing: list[Path]  # no MASKS/STEM.png
    wrong_size: list[tuple[Path, tuple[int, int], tuple[int, int]]]  # image, its size, the mask's size
    unreadable: list[Path]  # the mask is not an image Pillow reads

    def warning(self) -> str | None:
        """One line naming every image left out, or None."""
        parts = []
        if self.missing:
            parts.append(f"no mask for {_names(self.missing)}")
        if self.wrong_size:
            sizes = ", ".join(
                f"{path.name} (image {image[0]}x{image[1]}, mask {mask[0]}x{mask[1]})"
                for path, image, mask in self.wrong_size
            )
            parts.append(f"a mask of another size for {sizes}")
        if self.unreadable:
            parts.append(f"an unreadable mask for {_names(self.unreadable)}")
        if not parts:
            return None
        left = len(self.missing) + len(self.wrong_size) + len(self.unreadable)
        return f"left out {left} of {left + len(self.kept)} images: " + "; ".join(parts)


def _names(paths: Sequence[Path]) -> str:
    return ", ".join(path.name for path in paths)


def pair_masks(images: Sequence[Path], folder: Path) -> MaskedImages:
    """Which images have a usable mask MASKS/STEM.png (the rule of explain --masks) of the image's own size."""
    from PIL import Image, UnidentifiedImageError

    paired = MaskedImages([], [], [], [])
    for image in images:
        masks = [path for path in sorted(folder.glob(f"{image.stem}.*")) if path.suffix.lower() == ".png"]
        if not masks:
            paired.missing.append(image)
            continue
        try:
            with Image.open(masks[0]) as opened:
                mask_size = opened.size
        except (OSError, UnidentifiedImageError):
            paired.unreadable.append(image)
            continue
        try:
            with Image.open(image) as opened:
                image_size = opened.size
        except (OSError, UnidentifiedImageError):
            paired.kept.append(image)  # the run reports an unreadable image as it reports it everywhere
            continue
        if image_size != mask_size:
            paired.wrong_size.append((image, image_size, mask_size))
        else:
            paired.kept.append(image)
    return paired


# ----- scenes' facts


@dataclass(frozen=True)
class SceneFacts:
    """What a generated scene's row of labels.csv (vitcli.scenes' layout, next to the image) says: the true class,
    the kind of scene and, for a mosaic, the quadrants that hold the class (0 top left ... 3 bottom right)."""

    label: int | None = None
    kind: str = "single"
    quadrants: tuple[int, ...] = ()

    def quadrant_flags(self) -> tuple[int, int, int, int]:
        """The quadrants as four 0/1 flags in Quantus's order (vitcli.experiments.localisation.QUADRANTS)."""
        return tuple(int(quadrant in self.quadrants) for quadrant in range(4))  # type: ignore[return-value]


def scene_facts(image: Path) -> SceneFacts:
    """The row of `image` in labels.csv beside it; none (a user's own images): nothing known beyond the mask."""
    labels = image.parent / "labels.csv"
    if not labels.is_file():
        return SceneFacts()
    row = _labels(labels, labels.stat().st_mtime_ns).get(image.name)
    if row is None:
        return SceneFacts()
    try:
        quadrants = tuple(int(word) for word in (row.get("quadrants") or "").split())
        return SceneFacts(int(row["label"]), row.get("kind") or "single", quadrants)
    except (KeyError, ValueError) as error:
        raise VitcliError(
            f"{labels}: the row of {image.name} is not a scene's (file, label, kind, quadrants)"
        ) from error


@functools.lru_cache(maxsize=8)
def _labels(path: Path, modified: int) -> dict[str, dict[str, str]]:
    """labels.csv by file name, read once per version of the file (`modified` keys the cache)."""
    import csv

    with open(path, newline="", encoding="utf-8") as stream:
        return {row.get("file", ""): row for row in csv.DictReader(stream)}
