"""open_clip models beyond their image tower: checkpoints of the whole model, and the text tower that comes with it
(VitModel.text)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from vitcli.spec import WeightsSpec

VISUAL_PREFIX = "visual."


def load_open_clip_checkpoint(model: nn.Module, spec: WeightsSpec) -> bool:
    """Load --checkpoint into an open_clip model: the whole model's state dict (strictly), or its image tower's
    (keys with or without `visual.`). Returns whether the text side got weights too."""
    from vitcli.loading import _load_state, read_checkpoint

    assert spec.checkpoint is not None
    state = read_checkpoint(spec.checkpoint)
    if _has_text(state):
        _load_state(model, state, spec.checkpoint, spec.model_name)
        return True
    if any(key.startswith(VISUAL_PREFIX) for key in state):
        state = {key.removeprefix(VISUAL_PREFIX): value for key, value in state.items()}
    _load_state(model.visual, state, spec.checkpoint, spec.model_name)
    return False


def checkpoint_has_text(path: Path) -> bool:
    """Whether a checkpoint holds the text side of an open_clip model, from its header alone."""
    from vitcli.loading import _read_state

    return _has_text(_read_state(path, values=False))


def _has_text(state: dict[str, Any]) -> bool:
    """A whole model's state dict has keys outside `visual.` (the text transformer, logit_scale)."""
    return any(key.startswith(VISUAL_PREFIX) for key in state) and any(
        not key.startswith(VISUAL_PREFIX) for key in state
    )


def attach_text_tower(model: Any, whole: nn.Module | None) -> None:
    """model.text: the text tower of the whole open_clip model (None when a checkpoint gave the image tower alone)."""
    from vitcli.loading_towers import _open_clip_name
    from vitcli.text_tower import open_clip_text_tower

    if whole is not None:
        model.text = open_clip_text_tower(whole, _open_clip_name(model.name)[0], model.device)
