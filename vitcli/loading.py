"""Building a timm ViT and loading its weights: pretrained (HF cache or hub), a local checkpoint, or seeded random.

One load per process for the same arguments; every refusal is one line a person can act on. `describe` gives the
architecture facts (blocks, heads, grid, classes and their names) without loading any weights, so commands can check
their arguments first.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools

import timm
import torch
from timm.layers import PatchEmbed
from timm.models.vision_transformer import VisionTransformer

from vitcli.architecture import Architecture, architecture_from
from vitcli.capture import family_of, pre_norm_refusal
from vitcli.classes import class_names
from vitcli.errors import UsageError, VitcliError
from vitcli.model import VitModel
from vitcli.shapes_model import register as register_shapes_model
from vitcli.spec import WeightsSpec
from vitcli.tower_names import is_tower
from vitcli.weights import head_classes, hub_connection_problem, load_state, read_checkpoint, read_record, read_state

WEIGHTS_HELP = (
    "connect to the internet once so timm can download them into the Hugging Face cache "
    "(later runs may set HF_HUB_OFFLINE=1 to use only the cache), "
    "pass --checkpoint PATH (a .safetensors, .pth or .pt state dict), "
    "or use --weights random --seed N for an untrained model"
)

_LOADED: dict[tuple[WeightsSpec, str, int], VitModel] = {}
register_shapes_model()  # the shipped shapes model's architecture, known to timm before any name is checked


# Measured with benchmarks/occlusion.py: on a 2-core CPU batches of 8-16 ran ViT-Tiny fastest, 32 up to 20% slower.
CPU_BATCH_SIZE = 8
ACCELERATOR_BATCH_SIZE = 64


def load_model(spec: WeightsSpec, device: str = "auto", batch_size: int | None = None) -> VitModel:
    """Build the network, load its weights and wrap it; one load per process for the same arguments.

    batch_size None picks CPU_BATCH_SIZE on a CPU and ACCELERATOR_BATCH_SIZE on a GPU. A checkpoint's classifier
    head sets the number of classes (none: a headless model); the labels follow `class_names`.
    """
    key = (spec, device, batch_size)
    if key not in _LOADED:
        resolved = resolve_device(device)
        batch_size = batch_size or default_batch_size(resolved)
        skeleton = require_vit(spec.model_name)
        if is_tower(spec.model_name):  # hf:FOLDER, open_clip:NAME (vitcli.loading_towers)
            from vitcli.loading_towers import load_tower

            _LOADED[key] = load_tower(spec, resolved, batch_size)
            return _LOADED[key]
        if spec.random:
            labels = class_names(spec, skeleton.num_classes, skeleton.pretrained_cfg)
            torch.manual_seed(spec.seed)
            net = timm.create_model(spec.model_name, pretrained=False)
        elif spec.checkpoint is not None:
            state = read_checkpoint(spec.checkpoint)
            spec = dataclasses.replace(spec, recorded=read_record(spec.checkpoint))
            num_classes = head_classes(state, skeleton)
            labels = class_names(spec, num_classes, skeleton.pretrained_cfg)
            net = timm.create_model(spec.model_name, pretrained=False, num_classes=num_classes)
            load_state(net, state, spec.checkpoint, spec.model_name)
        else:
            labels = class_names(spec, skeleton.num_classes, skeleton.pretrained_cfg)
            net = _create_pretrained(spec.model_name)
        model = VitModel(net, spec, resolved, batch_size)
        model.labels = list(labels)
        _LOADED[key] = model
    return _LOADED[key]


def describe(spec: WeightsSpec) -> Architecture:
    """The architecture facts of a spec without loading weights: timm's meta-device skeleton, and of a checkpoint
    only its header (for the classifier head's shape) and the labels files beside it."""
    if is_tower(spec.model_name):
        from vitcli.loading_towers import describe_tower

        return describe_tower(spec)
    from vitcli.zero_shot import refuse_templates

    skeleton = require_vit(spec.model_name)
    refuse_templates(spec)
    family = family_of(skeleton)
    num_classes = family.num_classes
    if not spec.random and spec.checkpoint is not None:
        num_classes = head_classes(read_state(spec.checkpoint, values=False), skeleton)
    labels = class_names(spec, num_classes, getattr(skeleton, "pretrained_cfg", {}))
    return architecture_from(spec.model_name, family, num_classes, labels)


def default_batch_size(device: torch.device) -> int:
    return CPU_BATCH_SIZE if device.type == "cpu" else ACCELERATOR_BATCH_SIZE


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise VitcliError("--device cuda: no CUDA GPU is available to torch on this machine")
    if name == "mps" and not torch.backends.mps.is_available():
        raise VitcliError("--device mps: Apple's MPS backend is not available on this machine")
    return torch.device(name)


@functools.lru_cache(maxsize=8)
def require_vit(name: str) -> torch.nn.Module:
    """Refuse unknown names and tags and networks no family adapter knows before any weights are fetched; return the
    checked skeleton (built on the meta device: shapes only, no memory, no weights). Built once per name and process:
    the usage checks, the loader and compare-patch-size all read it, and none modifies it. What each command needs
    of the family is checked per command (capture.support)."""
    if is_tower(name):  # hf:FOLDER, open_clip:NAME: wrapped to read as a timm ViT (vitcli.loading_towers)
        from vitcli.loading_towers import tower_skeleton

        return tower_skeleton(name)
    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=3, cutoff=0.6)
        listing = "; `python -c \"import timm; print(timm.list_models('vit_*'))\"` lists ViTs"
        hint = f"; did you mean {', '.join(close)}?" if close else listing
        raise UsageError(f"unknown model name {name!r}{hint}")
    architecture, tag = timm.models.split_model_name_tag(name)
    try:
        timm.models.get_pretrained_cfg(name)
    except RuntimeError as error:
        tags = [known.split(".", 1)[1] for known in timm.list_pretrained(f"{architecture}.*")]
        known = f"its tags are {', '.join(tags)}" if tags else f"it has none: use {architecture}"
        raise UsageError(f"unknown pretrained tag {tag!r} for {architecture}; {known}") from error
    try:
        # Initialising weights costs most of a meta build (5x for ViT-Tiny), and a skeleton has no values to set.
        skeleton = timm.create_model(name, pretrained=False, device="meta", weight_init="skip")
    except TypeError:  # not a VisionTransformer: its constructor takes no weight_init
        skeleton = timm.create_model(name, pretrained=False, device="meta")
    try:
        family_of(skeleton)
    except ValueError as error:
        raise UsageError(
            f"{name} is a {type(skeleton).__name__}, not a Vision Transformer; vitcli inspects timm ViTs"
        ) from error
    # A CNN stem (timm's hybrid ViTs) is refused whole: the explicit forward most commands still run multiplies the
    # pixels by one patch projection.
    if isinstance(skeleton, VisionTransformer) and type(skeleton.patch_embed) is not PatchEmbed:
        raise UsageError(
            f"{name} embeds patches with {type(skeleton.patch_embed).__name__}, not one linear map of pixels"
        )
    return skeleton


def require_pre_norm(model_name: str) -> torch.nn.Module:
    """The meta skeleton of `model_name`, refused with UsageError unless its blocks can be taken apart."""
    skeleton = require_vit(model_name)
    refusal = pre_norm_refusal(skeleton, model_name)
    if refusal is not None:
        raise UsageError(refusal)
    return skeleton


# ----- the Hugging Face hub


def _create_pretrained(name: str) -> VisionTransformer:
    """timm's own pretrained loading: Hugging Face cache first, the hub when reachable."""
    from huggingface_hub import constants, try_to_load_from_cache

    cfg = timm.models.get_pretrained_cfg(name)
    hub_id = getattr(cfg, "hf_hub_id", None) if cfg is not None else None
    cached = hub_id and any(
        isinstance(try_to_load_from_cache(hub_id, filename), str)
        for filename in ("model.safetensors", "open_clip_model.safetensors", "pytorch_model.bin")
    )
    if hub_id and not cached:
        if constants.HF_HUB_OFFLINE:
            raise VitcliError(
                f"no weights for {name}: they are not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and "
                f"HF_HUB_OFFLINE=1 forbids downloading them; {WEIGHTS_HELP}"
            )
        # Without this, huggingface_hub retries a refused or unresolvable host for most of a minute before failing.
        problem = hub_connection_problem(constants.ENDPOINT)
        if problem is not None:
            raise VitcliError(
                f"no weights for {name}: they are not in the Hugging Face cache and {constants.ENDPOINT} "
                f"cannot be reached ({problem}); {WEIGHTS_HELP}"
            )
    try:
        return timm.create_model(name, pretrained=True)
    except Exception as error:
        raise VitcliError(
            f"could not load pretrained weights for {name} (--debug shows why); {WEIGHTS_HELP}"
        ) from error
