"""`vitcli bench`'s numbers: which scores it measures, each image's scores read from explain's result body, the
pairing of images with their masks, and the leaderboard over images (mean and a 95% bootstrap interval per method and
score, ranked per score).

Torch-free: the leaderboard is computed from the stored per-image JSON bodies alone, so shards, resumed runs and
`vitcli merge` give the numbers a fresh run gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitcli.errors import UsageError


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
    "road_combined": "road_combined",
    "sanity_spearman": "sanity_all_blocks_spearman_abs",
    "max_sensitivity": "max_sensitivity",
}
CONFIDENCE = 0.95
RESAMPLES = 2000
BOOTSTRAP_SEED = 0  # fixed: the same values give the same interval in every run and merge
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


def bootstrap_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (Efron), RESAMPLES resamples from a fixed seed; the values are
    sorted first, so the order the images came in (shards, merges) does not change it."""
    data = np.sort(np.asarray(values, dtype=float))
    if len(data) == 1:
        return float(data[0]), float(data[0])
    generator = np.random.default_rng(BOOTSTRAP_SEED)
    means = data[generator.integers(0, len(data), size=(RESAMPLES, len(data)))].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


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
    """Per score and method over the images' bench bodies: mean, bootstrap interval and rank; then one row per
    method that could not run, with its reason (the first image's: every image of a run has the same)."""
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
            low, high = bootstrap_interval(listed)
            rows.append(LeaderboardRow(method, score, len(listed), means[method], low, high, better + 1))
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


# ----- scenes' facts and Focus


@dataclass(frozen=True)
class SceneFacts:
    """What a generated scene's sidecar MASKS/STEM.json says: the true class, the kind of scene and, for a mosaic,
    the quadrants (0 top left, 1 top right, 2 bottom left, 3 bottom right) that hold the class."""

    label: int | None = None
    kind: str = "single"
    quadrants: tuple[int, ...] = ()


def scene_facts(folder: Path | None, image: Path) -> SceneFacts:
    """The sidecar of `image` in the masks folder; none (a user's own masks): nothing known beyond the mask."""
    import json

    if folder is None:
        return SceneFacts()
    path = folder / f"{image.stem}.json"
    if not path.is_file():
        return SceneFacts()
    facts = json.loads(path.read_text(encoding="utf-8"))
    return SceneFacts(facts.get("label"), facts.get("kind", "single"), tuple(facts.get("quadrants") or ()))


def focus(values: np.ndarray, quadrants: Sequence[int]) -> float | None:
    """Focus (Arias-Duart et al. 2022) on a 2x2 mosaic: the share of the positive map mass in the quadrants that hold
    the target class; None when the map has no positive mass. The patch grid is cut in halves (an odd count of rows
    or columns leaves the middle one to the upper or left quadrant)."""
    positive = np.clip(np.nan_to_num(np.asarray(values, dtype=float), nan=0.0), 0, None)
    total = float(positive.sum())
    if total <= 0:
        return None
    rows, cols = positive.shape
    middle_row, middle_col = -(-rows // 2), -(-cols // 2)
    pieces = (
        positive[:middle_row, :middle_col],
        positive[:middle_row, middle_col:],
        positive[middle_row:, :middle_col],
        positive[middle_row:, middle_col:],
    )
    return float(sum(pieces[quadrant].sum() for quadrant in set(quadrants)) / total)
