"""What a command asks of the model wrapper, in a module light enough for the CLI's start-up path."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitcli import shapes_model
from vitcli.errors import UsageError

DEFAULT_MODEL = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
# The seeds torch.manual_seed accepts (negative ones are folded into the unsigned 64-bit range).
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
# explain --random-orders: 1,000 orders at 49 steps are about 100,000 forwards per image (40 minutes on a 2-core CPU);
# more only add memory and time, never a better baseline.
MAX_RANDOM_ORDERS = 1000


_ASCII_NUMBER = re.compile(r"[0-9]+")


def ascii_number(text: str) -> int | None:
    """The number `text` writes in ASCII digits (spaces around allowed), else None.

    Every option that reads a number from text uses this, never str.isdigit or int() alone: isdigit accepts "²",
    which int() refuses (an internal error), and int() accepts "٣", "+3" and "1_0", which no result name carries."""
    stripped = text.strip()
    return int(stripped) if _ASCII_NUMBER.fullmatch(stripped) else None


def check_seed(option: str, value: int) -> int:
    """A seed option within what torch's generators accept, refused before anything is built or loaded."""
    if not SEED_MIN <= value <= SEED_MAX:
        raise UsageError(f"{option} {value} is outside the range torch accepts: {SEED_MIN} to {SEED_MAX}")
    return value


def fitted_count(option: str, value: int | None, default: int, high: int, why: str) -> int:
    """A count whose default depends on the model: None (not given) takes min(default, high), so a default always
    fits the model; only a given value outside 1..high is refused."""
    return min(default, high) if value is None else check_count(option, value, 1, high, why)


def check_count(option: str, value: int, low: int, high: int, why: str) -> int:
    """A count option within [low, high]; `why` says where the upper bound comes from."""
    if not low <= value <= high:
        raise UsageError(f"{option} must be between {low} and {high} ({why}), not {value}")
    return value


def check_weights_source(random: bool, checkpoint: Path | None) -> None:
    """One source of weights: the pretrained ones, a checkpoint or seeded random weights, never two."""
    if random and checkpoint is not None:
        raise UsageError("--checkpoint and --weights random contradict each other: choose one source of weights")


@dataclass(frozen=True)
class WeightsSpec:
    """Which network to build, where its weights come from and where its class names come from.

    labels: a text file with one class name per line (UTF-8); None looks beside the checkpoint, then uses timm's
    ImageNet names when the head has their number of classes (see `vitcli.classes.class_names`). label_names: the
    names given as a comma-separated list instead. On a model with a text tower either makes it a zero-shot
    classifier of those labels.
    """

    model_name: str = DEFAULT_MODEL
    random: bool = False
    seed: int = 0
    checkpoint: Path | None = None
    labels: Path | None = None
    # --labels "dog,cat,car": the names themselves (a list, not a file); on a model with a text tower, with `labels`'
    # file's names, the zero-shot classes (vitcli.zero_shot).
    label_names: tuple[str, ...] | None = None
    # --template "a photo of a {}.": the texts a label or target text is put in (averaged, CLIP's recipe).
    templates: tuple[str, ...] = ()
    # What a checkpoint vitcli wrote records about the weights it was made from (`vitcli probe`: the backbone's
    # model, weights, seed and parameter hash, and the probe's settings); filled by the loader from the file, never
    # given by users, and no part of the spec's identity.
    recorded: Mapping[str, Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # The one check of where the weights come from, whichever front end built the spec (the command line, a
        # run config, the Python API); before anything is built: torch would refuse a bad seed only after the
        # skeleton and imports.
        check_weights_source(self.random, self.checkpoint)
        # The frozen spec is completed once, here, so every front end resolves `--model shapes` alike.
        model_name, checkpoint = shapes_model.resolve(self.model_name, self.random, self.checkpoint)
        object.__setattr__(self, "model_name", model_name)
        object.__setattr__(self, "checkpoint", checkpoint)
        check_seed("--seed", self.seed)

    @property
    def label(self) -> str:
        """How every table and CSV row names the weights."""
        if self.random:
            return f"RANDOM (seed {self.seed})"
        if self.checkpoint is not None:
            seed = self.untrained_backbone_seed
            if seed is not None:
                return f"RANDOM (seed {seed}) backbone in checkpoint {self.checkpoint.name}"
            return f"checkpoint {self.checkpoint.name}"
        return "pretrained"

    @property
    def untrained_backbone_seed(self) -> int | None:
        """The seed of the random weights a checkpoint's backbone came from, as the checkpoint records it; None for
        trained backbones and checkpoints that record nothing."""
        backbone = (self.recorded or {}).get("backbone")
        if not isinstance(backbone, Mapping):
            return None
        seed = backbone.get("untrained_seed")
        return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def parse_labels(value: str | None, option: str = "--labels") -> tuple[Path | None, tuple[str, ...] | None]:
    """--labels: a file (a value naming an existing file, ending in .txt, or holding a path separator) or a
    comma-separated list of names (surrounding spaces dropped). Returns (file, None) or (None, names)."""
    if value is None:
        return None, None
    path = Path(value).expanduser()
    if value.lower().endswith(".txt") or "/" in value or os.sep in value or _is_file(path):
        return path, None
    names = tuple(name.strip() for name in value.split(","))
    if not any(names):
        raise UsageError(f'{option} {value!r} names no labels: give comma-separated names ("dog,cat") or a file')
    empty = [number for number, name in enumerate(names, start=1) if not name]
    if empty:
        raise UsageError(f"{option} {value!r}: name {empty[0]} of the list is empty; give comma-separated names")
    repeated = next((name for index, name in enumerate(names) if name in names[:index]), None)
    if repeated is not None:
        raise UsageError(f"{option} names {repeated!r} twice; give each label once")
    return None, names


# Where a template puts the label, as CLIP's templates write it ("a photo of a {}.").
PLACEHOLDER = "{}"


def check_templates(templates: tuple[str, ...]) -> None:
    """Each --template holds `{}` where the label goes."""
    for template in templates:
        if PLACEHOLDER not in template:
            raise UsageError(f"--template {template!r} holds no {PLACEHOLDER} where the label goes")


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a name too long for the file system is no file
        return False
