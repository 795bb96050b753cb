"""The names of a model's classes: labels files, ImageNet's names, "class N". Naming a class on the command line is
vitcli.target_class."""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vitcli.errors import UsageError, VitcliError
from vitcli.spec import WeightsSpec


def class_names(spec: WeightsSpec, num_classes: int, pretrained_cfg: Mapping[str, Any]) -> tuple[str, ...]:
    """From spec.labels, else `<checkpoint stem>.labels.txt` beside the checkpoint, else `labels.txt` in its folder,
    else timm's ImageNet names when the head has the pretrained config's classes, else "class N"."""
    if num_classes == 0 and spec.labels is None and spec.label_names is None:
        return ()  # a headless model has no classes to name, whatever labels files lie beside it
    if spec.label_names is not None:
        if len(spec.label_names) != num_classes:
            raise UsageError(
                f"--labels names {len(spec.label_names)} classes but {spec.model_name} has {num_classes}"
                + ("" if num_classes else " (no classifier head; zero-shot labels need a model with a text tower)")
            )
        return spec.label_names
    path = _labels_file(spec)
    if path is not None:
        names = read_labels(path)
        if len(names) != num_classes:
            counted = f"{len(names)} name" if len(names) == 1 else f"{len(names)} names"
            raise VitcliError(
                f"labels file {path} has {counted} but the model has {num_classes} classes (one name per line)"
            )
        return names
    import timm  # on first use: resolving a --target does not need it

    subset = timm.data.infer_imagenet_subset(dict(pretrained_cfg))
    if subset is not None and num_classes == pretrained_cfg.get("num_classes"):
        return _imagenet_names(subset)
    return tuple(f"class {index}" for index in range(num_classes))


def read_labels(path: Path) -> tuple[str, ...]:
    """One class name per line (UTF-8, surrounding spaces dropped); blank lines at the end are ignored."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise VitcliError(f"labels file {path} is not UTF-8 text; save it as UTF-8, one name per line") from error
    except OSError as error:
        raise VitcliError(f"cannot read labels file {path}: {(error.strerror or str(error)).lower()}") from error
    # Lines end at "\n" alone: str.splitlines would also cut at U+2028, U+0085 or U+001C inside a name, and the
    # count of names would then not be the count of lines a person sees.
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    for number, line in enumerate(lines, start=1):
        breaks = [char for char in line if unicodedata.category(char) in ("Cc", "Zl", "Zp") and char != "\t"]
        if breaks:
            raise VitcliError(
                f"labels file {path}: line {number} holds a line break or control character "
                f"(U+{ord(breaks[0]):04X}); give one name per line"
            )
    names = [line.strip() for line in lines]
    while names and not names[-1]:
        names.pop()
    if "" in names:
        raise VitcliError(f"labels file {path}: line {names.index('') + 1} is empty; give one name per line")
    return tuple(names)


def _labels_file(spec: WeightsSpec) -> Path | None:
    if spec.labels is not None:
        if not spec.labels.is_file():
            raise VitcliError(f"labels file not found: {spec.labels}")
        return spec.labels
    if spec.checkpoint is not None and not spec.random:
        checkpoint = spec.checkpoint
        for candidate in (checkpoint.with_name(f"{checkpoint.stem}.labels.txt"), checkpoint.with_name("labels.txt")):
            if candidate.is_file():
                return candidate
    return None


@functools.lru_cache(maxsize=4)
def _imagenet_names(subset: str) -> tuple[str, ...]:
    import timm

    return tuple(timm.data.ImageNetInfo(subset).label_descriptions())
