"""What names an hf: or open_clip: model and what loading one needs before any library loads: the prefixes, the
open_clip name and tag, the optional extras (a missing one refused in one line naming the pip command) and quiet
library logs. Below both loaders (vitcli.loading_towers, vitcli.loading_open_clip) and the text side."""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Iterator
from typing import Any

from vitcli.errors import UsageError

HF_PREFIX, OPEN_CLIP_PREFIX = "hf:", "open_clip:"

OPEN_CLIP_WEIGHTS_HELP = (
    "connect to the internet once so open_clip can download them into the Hugging Face cache, "
    "pass --checkpoint PATH (a state dict of the CLIP model or of its image tower), "
    "or use --weights random --seed N for an untrained model"
)


def is_tower(name: str) -> bool:
    """Whether a model name is one of these (hf:... or open_clip:...), not a timm name."""
    return name.startswith((HF_PREFIX, OPEN_CLIP_PREFIX))


def extra_module(module: str, extra: str, name: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as error:
        package = {"hf": "Hugging Face transformers", "clip": "open_clip"}[extra]
        raise UsageError(f"--model {name} needs {package}: pip install 'vitcli[{extra}]'") from error


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Neither library's log lines ("No pretrained weights loaded", loading reports) nor transformers' progress bars
    ("Loading weights") reach vitcli's stderr."""
    import sys

    hf_logging = getattr(sys.modules.get("transformers"), "logging", None)
    bars = hf_logging is not None and hf_logging.is_progress_bar_enabled()
    logging.disable(logging.WARNING)
    if bars:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)
        if bars:
            hf_logging.enable_progress_bar()


def open_clip_name(name: str) -> tuple[str, str | None]:
    model_name, _, tag = name.removeprefix(OPEN_CLIP_PREFIX).partition("/")
    return model_name, tag or None
