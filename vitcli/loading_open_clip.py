"""Loading open_clip models (`--model open_clip:NAME[/TAG]`): the whole model (random, a tag's weights, or a
checkpoint of the whole model or of its image tower), its image tower as vitcli wraps it (open_clip's
VisionTransformer, or the timm trunk of SigLIP's TimmModel), and the text tower that comes with it (VitModel.text)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitcli.errors import UsageError, VitcliError
from vitcli.spec import WeightsSpec

VISUAL_PREFIX = "visual."


def load_open_clip_checkpoint(model: nn.Module, spec: WeightsSpec) -> bool:
    """Load --checkpoint into an open_clip model: the whole model's state dict (strictly), or its image tower's
    (keys with or without `visual.`). Returns whether the text side got weights too."""
    from vitcli.weights import load_state, read_checkpoint

    assert spec.checkpoint is not None
    state = read_checkpoint(spec.checkpoint)
    if _has_text(state):
        load_state(model, state, spec.checkpoint, spec.model_name)
        return True
    if any(key.startswith(VISUAL_PREFIX) for key in state):
        state = {key.removeprefix(VISUAL_PREFIX): value for key, value in state.items()}
    load_state(model.visual, state, spec.checkpoint, spec.model_name)
    return False


def checkpoint_has_text(path: Path) -> bool:
    """Whether a checkpoint holds the text side of an open_clip model, from its header alone."""
    from vitcli.weights import read_state

    return _has_text(read_state(path, values=False))


def _has_text(state: dict[str, Any]) -> bool:
    """A whole model's state dict has keys outside `visual.` (the text transformer, logit_scale)."""
    return any(key.startswith(VISUAL_PREFIX) for key in state) and any(
        not key.startswith(VISUAL_PREFIX) for key in state
    )


def attach_text_tower(model: Any, whole: nn.Module | None) -> None:
    """model.text: the text tower of the whole open_clip model (None when a checkpoint gave the image tower alone)."""
    from vitcli.text_tower import open_clip_text_tower
    from vitcli.tower_names import open_clip_name

    if whole is not None:
        model.text = open_clip_text_tower(whole, open_clip_name(model.name)[0], model.device)


def has_text(spec: WeightsSpec, skeleton: nn.Module) -> bool:
    """Whether the model a spec loads will have a text tower: an open_clip model, with its text side's weights (a
    checkpoint of the image tower alone brings none)."""
    if not getattr(skeleton, "pairs_with_text", False):
        return False
    return spec.random or spec.checkpoint is None or checkpoint_has_text(spec.checkpoint)


def image_tower(visual: nn.Module, data_config: dict[str, Any]) -> nn.Module:
    """The net vitcli wraps of an open_clip image tower: OpenClipTower around open_clip's VisionTransformer, or the
    timm trunk of a TimmModel (SigLIP), both carrying open_clip's preprocessing."""
    from vitcli.capture.families.open_clip import OpenClipTower

    if type(visual).__name__ == "TimmModel":
        return _dressed_trunk(visual.trunk, data_config)
    return OpenClipTower(visual, data_config)


def timm_trunk(visual: nn.Module, model_name: str, data_config: dict[str, Any]) -> nn.Module:
    """The timm VisionTransformer inside open_clip's TimmModel (SigLIP's image tower: attention pooling 'map', no
    projection), checked: a trunk of another kind, or one whose output is projected again, is refused in one line."""
    from timm.models.vision_transformer import VisionTransformer

    trunk = visual.trunk
    if not isinstance(trunk, VisionTransformer):
        raise UsageError(
            f"open_clip:{model_name}'s image tower is timm's {type(trunk).__name__}; vitcli takes apart open_clip's "
            "VisionTransformer and timm VisionTransformer trunks (SigLIP's)"
        )
    added = [
        type(module).__name__ for module in visual.head.children() if type(module) not in (nn.Identity, nn.Dropout)
    ]
    if added or trunk.num_classes:
        what = ", ".join(added) if added else f"the trunk's own head ({trunk.num_classes} outputs)"
        raise UsageError(
            f"open_clip:{model_name}'s image tower projects the timm trunk's pooled output ({what}); vitcli reads "
            "trunks whose pooled output is the image embedding (timm_proj 'none', as SigLIP's)"
        )
    return _dressed_trunk(trunk, data_config)


def _dressed_trunk(trunk: nn.Module, data_config: dict[str, Any]) -> nn.Module:
    trunk.pretrained_cfg = dict(data_config)  # open_clip's preprocessing, which VitModel reads as timm's
    trunk.pairs_with_text = True
    return trunk


def load_open_clip(spec: WeightsSpec, skeleton: nn.Module) -> tuple[nn.Module, nn.Module | None]:
    """The wrapped image tower and the whole open_clip model (whose text side becomes VitModel.text), None for the
    latter when a checkpoint gave the image tower alone (the text side then has no weights)."""
    from vitcli.tower_names import OPEN_CLIP_WEIGHTS_HELP, extra_module, open_clip_name, quiet_libraries

    open_clip = extra_module("open_clip", "clip", spec.model_name)
    model_name, tag = open_clip_name(spec.model_name)
    with quiet_libraries():
        if spec.random or spec.checkpoint is not None:
            torch.manual_seed(spec.seed)
            model = open_clip.create_model(model_name, pretrained=None)
        else:
            _require_cached_or_reachable(spec.model_name, open_clip.get_pretrained_cfg(model_name, tag))
            try:
                model = open_clip.create_model(model_name, pretrained=tag)
            except Exception as error:
                raise VitcliError(
                    f"could not load the weights of {spec.model_name} (--debug shows why); {OPEN_CLIP_WEIGHTS_HELP}"
                ) from error
    with_text = spec.random or spec.checkpoint is None or load_open_clip_checkpoint(model, spec)
    provenance = {"tag": tag} if not spec.random and spec.checkpoint is None else {}
    return image_tower(model.visual, {**skeleton.pretrained_cfg, **provenance}), model if with_text else None


def _require_cached_or_reachable(name: str, pretrained: dict[str, Any]) -> None:
    """Refuse within seconds, in one line, a tag whose weights are neither in the Hugging Face cache nor downloadable
    (offline, or the hub unreachable), as timm's pretrained weights are (loading._create_pretrained)."""
    from huggingface_hub import constants, try_to_load_from_cache

    from vitcli.tower_names import OPEN_CLIP_WEIGHTS_HELP
    from vitcli.weights import hub_connection_problem

    model_id, filename = os.path.split(pretrained.get("hf_hub", ""))
    if not model_id:
        return  # a plain URL: open_clip's own download says what fails
    stem = os.path.splitext(filename or "open_clip_pytorch_model.bin")[0]
    candidates = (filename or "open_clip_pytorch_model.bin", f"{stem}.safetensors", "open_clip_model.safetensors")
    if any(isinstance(try_to_load_from_cache(model_id, candidate), str) for candidate in candidates):
        return
    if constants.HF_HUB_OFFLINE:
        raise VitcliError(
            f"no weights for {name}: they are not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and "
            f"HF_HUB_OFFLINE=1 forbids downloading them; {OPEN_CLIP_WEIGHTS_HELP}"
        )
    problem = hub_connection_problem(constants.ENDPOINT)
    if problem is not None:
        raise VitcliError(
            f"no weights for {name}: they are not in the Hugging Face cache and {constants.ENDPOINT} cannot be "
            f"reached ({problem}); {OPEN_CLIP_WEIGHTS_HELP}"
        )
