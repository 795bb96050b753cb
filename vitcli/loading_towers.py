"""Models from outside timm: `--model hf:FOLDER` (a Hugging Face `transformers` ViT saved with save_pretrained) and
`--model open_clip:NAME[/TAG]` (an open_clip image tower).

Each is wrapped in a thin module that carries what vitcli reads of a timm ViT (`HFTower`, `OpenClipTower`), so the
model wrapper, the capture layer and every command see one kind of net. transformers and open_clip are optional
extras: they are imported only here and in their family adapters, and a missing one is refused in one line naming the
pip command, before anything loads. The checks run on a meta-device skeleton, as for timm's models.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitcli.errors import UsageError, VitcliError
from vitcli.spec import WeightsSpec
from vitcli.tower_names import (
    HF_PREFIX,
    extra_module,
    open_clip_name,
    quiet_libraries,
)

HF_CLASSES = ("ViTModel", "ViTForImageClassification", "Dinov2Model", "Dinov2WithRegistersModel", "CLIPVisionModel")
# The class save_pretrained records in config.architectures, or, for configs without one, by model_type.
HF_CLASS_OF_TYPE = {
    "vit": "ViTModel",
    "dinov2": "Dinov2Model",
    "dinov2_with_registers": "Dinov2WithRegistersModel",
    "clip_vision_model": "CLIPVisionModel",
}
HF_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
# PIL's resampling filters by number, as transformers' preprocessor configs write them, in timm's names.
PIL_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


# ----- skeletons (usage checks, before any weights load)


@functools.lru_cache(maxsize=8)
def tower_skeleton(name: str) -> nn.Module:
    """The checked meta-device skeleton of hf:FOLDER or open_clip:NAME[/TAG], wrapped; UsageError otherwise."""
    if name.startswith(HF_PREFIX):
        return _hf_skeleton(name)
    return _open_clip_skeleton(name)


def _hf_folder(name: str) -> Path:
    folder = Path(name.removeprefix(HF_PREFIX)).expanduser()
    if not folder.is_dir():
        problem = "is a file, not a folder" if folder.exists() else "does not exist"
        raise UsageError(f"--model {name}: {folder} {problem}; give a folder saved with save_pretrained")
    if not (folder / "config.json").is_file():
        raise UsageError(f"--model {name}: {folder} holds no config.json; give a folder saved with save_pretrained")
    return folder


def _hf_class(name: str, config: Any) -> str:
    known = list(getattr(config, "architectures", None) or [])
    chosen = known[0] if known else HF_CLASS_OF_TYPE.get(getattr(config, "model_type", ""))
    if chosen not in HF_CLASSES:
        what = chosen or f"model type {getattr(config, 'model_type', None)!r}"
        raise UsageError(f"--model {name} holds a {what}; vitcli loads {', '.join(HF_CLASSES)}")
    return chosen


def _hf_config(name: str) -> tuple[Any, str]:
    transformers = extra_module("transformers", "hf", name)
    folder = _hf_folder(name)
    try:
        config = transformers.AutoConfig.from_pretrained(folder)
    except Exception as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else "unreadable"
        raise UsageError(f"--model {name}: its config.json cannot be read ({first})") from error
    return config, _hf_class(name, config)


def _hf_skeleton(name: str) -> nn.Module:
    from vitcli.capture.families.hf import HFTower, missing_modules

    transformers = extra_module("transformers", "hf", name)
    config, class_name = _hf_config(name)
    with quiet_libraries(), torch.device("meta"):
        model = getattr(transformers, class_name)._from_config(config, attn_implementation="eager")
    missing = missing_modules(model)
    if missing:
        raise UsageError(
            f"--model {name}: the {class_name} of transformers {transformers.__version__} has no {missing[0]}; "
            "vitcli reads the module layout of transformers 5"
        )
    return HFTower(model, hf_data_config(_hf_folder(name), config))


def hf_data_config(folder: Path, config: Any) -> dict[str, Any]:
    """timm's data config of the folder's preprocessor_config.json (size, centre crop, resampling, mean, std), or,
    without one, of the config's image size with the model's documented defaults (vitcli.capture.families.hf)."""
    from vitcli.capture.families.hf import default_data_config

    defaults = default_data_config(config)
    path = folder / "preprocessor_config.json"
    if not path.is_file():
        return defaults
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"--model hf:{folder}: its preprocessor_config.json cannot be read ({error})") from error
    size = settings.get("size") or {}
    crop = settings.get("crop_size") if settings.get("do_center_crop") else None
    if isinstance(crop, dict) and "height" in crop:
        height, width = int(crop["height"]), int(crop["width"])
        if "shortest_edge" in size:  # resize the short side, then crop the centre
            crop_pct, crop_mode = min(height, width) / int(size["shortest_edge"]), "center"
        else:  # squash to size, then crop the centre
            crop_pct, crop_mode = height / int(size.get("height", height)), "squash"
    elif "height" in size:  # squash to the size, no crop
        height, width, crop_pct, crop_mode = int(size["height"]), int(size["width"]), 1.0, "squash"
    elif "shortest_edge" in size:  # the short side to this size, then the square in its centre
        height = width = int(size["shortest_edge"])
        crop_pct, crop_mode = 1.0, "center"
    else:
        height, width = defaults["input_size"][1:]
        crop_pct, crop_mode = defaults["crop_pct"], defaults["crop_mode"]
    normalize = settings.get("do_normalize", True)
    return {
        "input_size": (3, height, width),
        "interpolation": PIL_RESAMPLE.get(settings.get("resample"), defaults["interpolation"]),
        "mean": tuple(settings.get("image_mean", defaults["mean"])) if normalize else (0.0, 0.0, 0.0),
        "std": tuple(settings.get("image_std", defaults["std"])) if normalize else (1.0, 1.0, 1.0),
        "crop_pct": crop_pct,
        "crop_mode": crop_mode,
    }


def _open_clip_skeleton(name: str) -> nn.Module:
    from vitcli.capture.families.open_clip import OpenClipFamily, OpenClipTower, data_config

    open_clip = extra_module("open_clip", "clip", name)
    model_name, tag = open_clip_name(name)
    known = open_clip.list_models()
    if model_name not in known:
        close = difflib.get_close_matches(model_name, known, n=3, cutoff=0.6)
        hint = (
            f"did you mean {', '.join(close)}?"
            if close
            else '`python -c "import open_clip; print(open_clip.list_models())"` lists them'
        )
        raise UsageError(f"unknown open_clip model {model_name!r}; {hint}")
    tags = open_clip.list_pretrained_tags_by_model(model_name)
    if tag is not None and tag not in tags:
        listed = f"its tags are {', '.join(tags)}" if tags else "it has none: use --checkpoint or --weights random"
        raise UsageError(f"unknown pretrained tag {tag!r} for open_clip:{model_name}; {listed}")
    with quiet_libraries(), torch.device("meta"):
        model = open_clip.create_model(model_name, pretrained=None, device="meta")
    visual = model.visual
    preprocess = dict(open_clip.get_model_preprocess_cfg(model))
    if tag is not None:  # a tag's own preprocessing (SigLIP's mean and std, ...) wins over the architecture's
        pretrained = open_clip.get_pretrained_cfg(model_name, tag)
        preprocess.update({key: pretrained[key] for key in preprocess if key in pretrained})
    if type(visual).__name__ == "TimmModel":  # SigLIP's: a timm trunk (vitcli.loading_open_clip)
        from vitcli.loading_open_clip import timm_trunk

        return timm_trunk(visual, model_name, data_config(preprocess))
    if type(visual).__module__ != "open_clip.transformer" or type(visual).__name__ != "VisionTransformer":
        raise UsageError(
            f"open_clip:{model_name}'s image tower is a {type(visual).__name__}, not open_clip's VisionTransformer "
            "or a timm VisionTransformer (SigLIP's), which vitcli takes apart"
        )
    tower = OpenClipTower(visual, data_config(preprocess))
    refusal = OpenClipFamily(tower).refusal()
    if refusal is not None:
        raise UsageError(f"open_clip:{model_name} is not a ViT vitcli can take apart: {refusal}")
    return tower


# ----- usage checks and facts of a spec


def check_tower_spec(spec: WeightsSpec) -> None:
    """What a spec's weights need beyond the model name: a weights file in the hf: folder (unless random), no
    --checkpoint for hf:, and for open_clip: a tag, a checkpoint or random weights."""
    name = spec.model_name
    if spec.random:
        return
    if name.startswith(HF_PREFIX):
        if spec.checkpoint is not None:
            raise UsageError(f"--model {name} takes its weights from the folder; --checkpoint does not apply")
        folder = _hf_folder(name)
        if not any((folder / file).is_file() for file in HF_WEIGHT_FILES):
            raise UsageError(
                f"--model {name}: {folder} holds no weights ({' or '.join(HF_WEIGHT_FILES[::2])}); "
                "save the model with save_pretrained, or use --weights random --seed N"
            )
    elif spec.checkpoint is None and open_clip_name(name)[1] is None:
        model_name = open_clip_name(name)[0]
        raise UsageError(
            f"--model {name} names no pretrained weights: write open_clip:{model_name}/TAG "
            "(`open_clip.list_pretrained_tags_by_model` lists them), pass --checkpoint PATH, or use --weights random"
        )


def tower_labels(spec: WeightsSpec, tower: nn.Module) -> tuple[str, ...]:
    """A classifier's names: --labels, else the config's id2label; a model without a classifier has none."""
    from vitcli.classes import class_names

    if tower.num_classes == 0 or spec.labels is not None:
        return class_names(spec, tower.num_classes, {})
    id2label = tower.model.config.id2label
    return tuple(str(id2label.get(index, f"class {index}")) for index in range(tower.num_classes))


def describe_tower(spec: WeightsSpec) -> Any:
    """loading.describe for hf: and open_clip: models: the family's facts and features, as for timm's models; with
    labels, a model with a text tower is their zero-shot classifier (vitcli.zero_shot)."""
    from vitcli.architecture import architecture_from
    from vitcli.capture import family_of
    from vitcli.loading_open_clip import has_text
    from vitcli.zero_shot import check_texts, refuse_templates, spec_labels

    skeleton = tower_skeleton(spec.model_name)
    check_tower_spec(spec)
    family = family_of(skeleton)
    text = has_text(spec, skeleton)
    if not text:
        refuse_templates(spec)
    zero_shot = spec_labels(spec) if text else None
    if zero_shot is not None:
        check_texts(spec, zero_shot)
    fc1 = next(module for module in skeleton.blocks[0].mlp.modules() if isinstance(module, nn.Linear))
    if zero_shot is not None:
        architecture = architecture_from(spec.model_name, family, len(zero_shot), zero_shot)
    else:
        architecture = architecture_from(spec.model_name, family, family.num_classes, tower_labels(spec, skeleton))
    features = architecture.features if text else architecture.features - {"text_tower"}
    if zero_shot is not None:
        features -= {"linear_head"}  # the zero-shot head normalizes the embedding (vitcli.zero_shot)
    return dataclasses.replace(architecture, mlp_hidden=fc1.out_features, features=features)


# ----- loading


def load_tower(spec: WeightsSpec, device: torch.device, batch_size: int) -> Any:
    """The VitModel of an hf: or open_clip: spec (loading.load_model for these)."""
    from vitcli.model import VitModel
    from vitcli.zero_shot import spec_labels

    architecture = describe_tower(spec)  # every usage check, and the labels (zero-shot ones too)
    skeleton = tower_skeleton(spec.model_name)
    labels = architecture.labels
    whole = None
    if spec.model_name.startswith(HF_PREFIX):
        tower = _load_hf(spec, skeleton)
    else:
        from vitcli.loading_open_clip import load_open_clip

        tower, whole = load_open_clip(spec, skeleton)
    model = VitModel(tower, spec, device, batch_size)
    model.labels = list(labels)
    if whole is not None:
        from vitcli.loading_open_clip import attach_text_tower

        attach_text_tower(model, whole)
    if model.text is not None and spec_labels(spec) is not None:
        from vitcli.zero_shot import install

        install(model, tuple(labels), model.text)
    return model


def _load_hf(spec: WeightsSpec, skeleton: nn.Module) -> nn.Module:
    from vitcli.capture.families.hf import HFTower

    transformers = extra_module("transformers", "hf", spec.model_name)
    config, class_name = _hf_config(spec.model_name)
    model_class = getattr(transformers, class_name)
    folder = _hf_folder(spec.model_name)
    with quiet_libraries():
        if spec.random:
            torch.manual_seed(spec.seed)
            model = model_class._from_config(config, attn_implementation="eager")
        else:
            try:
                model, info = model_class.from_pretrained(folder, attn_implementation="eager", output_loading_info=True)
            except Exception as error:
                raise VitcliError(
                    f"cannot load the weights of --model {spec.model_name} (--debug shows why)"
                ) from error
            missing = sorted(info.get("missing_keys") or [])
            if missing:
                raise VitcliError(
                    f"the weights in {folder} do not match its {class_name}: {len(missing)} missing tensors "
                    f"(e.g. {missing[0]})"
                )
    return HFTower(model, dict(skeleton.pretrained_cfg))
