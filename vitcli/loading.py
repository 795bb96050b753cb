"""Building a timm ViT and loading its weights: pretrained (HF cache or hub), a local checkpoint, or seeded random.

One load per process for the same arguments; every refusal is one line a person can act on.
"""

from __future__ import annotations

import difflib
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import timm
import torch
from timm.layers import PatchEmbed
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor

from vitcli.errors import UsageError, VitcliError
from vitcli.grid import PatchGrid
from vitcli.model import VitModel, prefix_names
from vitcli.spec import WeightsSpec

WEIGHTS_HELP = (
    "connect to the internet once so timm can download them into the Hugging Face cache, "
    "pass --checkpoint PATH (a .safetensors, .pth or .pt state dict), "
    "or use --weights random --seed N for an untrained model"
)

_LOADED: dict[tuple[WeightsSpec, str, int], VitModel] = {}


# Measured with benchmarks/occlusion.py: on a 2-core CPU batches of 8-16 ran ViT-Tiny fastest, 32 up to 20% slower.
CPU_BATCH_SIZE = 8
ACCELERATOR_BATCH_SIZE = 64


def load_model(spec: WeightsSpec, device: str = "auto", batch_size: int | None = None) -> VitModel:
    """Build the network, load its weights and wrap it; one load per process for the same arguments.

    batch_size None picks CPU_BATCH_SIZE on a CPU and ACCELERATOR_BATCH_SIZE on a GPU.
    """
    key = (spec, device, batch_size)
    if key not in _LOADED:
        resolved = resolve_device(device)
        batch_size = batch_size or default_batch_size(resolved)
        require_vit(spec.model_name)
        if spec.random:
            torch.manual_seed(spec.seed)
            net = timm.create_model(spec.model_name, pretrained=False)
        elif spec.checkpoint is not None:
            net = timm.create_model(spec.model_name, pretrained=False)
            load_checkpoint(net, spec.checkpoint, spec.model_name)
        else:
            net = _create_pretrained(spec.model_name)
        _LOADED[key] = VitModel(net, spec, resolved, batch_size)
    return _LOADED[key]


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


def require_vit(name: str) -> VisionTransformer:
    """Refuse unknown names and non-ViT architectures before any weights are fetched; return the checked
    skeleton (built on the meta device: shapes only, no memory, no weights)."""
    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `python -c \"import timm; print(timm.list_models('vit_*'))\"` lists ViTs"
        raise UsageError(f"unknown model name {name!r}{hint}")
    skeleton = timm.create_model(name, pretrained=False, device="meta")
    if not isinstance(skeleton, VisionTransformer):
        raise UsageError(f"{name} is a {type(skeleton).__name__}, not a Vision Transformer; vitcli inspects timm ViTs")
    if skeleton.cls_token is None:
        raise UsageError(f"{name} has no class token; vitcli follows ViTs that classify from a CLS token")
    if type(skeleton.patch_embed) is not PatchEmbed:
        raise UsageError(f"{name} embeds patches with {type(skeleton.patch_embed).__name__}, not one linear map of pixels")
    return skeleton


def _create_pretrained(name: str) -> VisionTransformer:
    """timm's own pretrained loading: Hugging Face cache first, the hub when reachable."""
    from huggingface_hub import constants, try_to_load_from_cache

    cfg = timm.models.get_pretrained_cfg(name)
    hub_id = getattr(cfg, "hf_hub_id", None) if cfg is not None else None
    if hub_id:
        cached = any(
            isinstance(try_to_load_from_cache(hub_id, filename), str)
            for filename in ("model.safetensors", "open_clip_model.safetensors", "pytorch_model.bin")
        )
        if not cached and not constants.HF_HUB_OFFLINE and not _reachable(constants.ENDPOINT):
            # Without this, huggingface_hub retries an unresolvable host for most of a minute before failing.
            raise VitcliError(
                f"no weights for {name}: they are not in the Hugging Face cache and {constants.ENDPOINT} "
                f"cannot be reached; {WEIGHTS_HELP}"
            )
    try:
        return timm.create_model(name, pretrained=True)
    except Exception as error:
        raise VitcliError(f"could not load pretrained weights for {name} ({type(error).__name__}); {WEIGHTS_HELP}") from error


def _reachable(endpoint: str) -> bool:
    """Whether the hub's host name resolves; behind a proxy the proxy resolves it, so assume yes."""
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")):
        return True
    host = urlparse(endpoint).hostname or endpoint
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return False
    return True


def load_checkpoint(net: torch.nn.Module, path: Path, name: str) -> None:
    """Load a .safetensors file or a .pth/.pt state dict (tensors only, never pickled objects), strictly."""
    if not path.is_file():
        raise VitcliError(f"checkpoint not found: {path}")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise VitcliError(f"cannot read checkpoint {path}: {str(error).splitlines()[0] if str(error) else type(error).__name__}") from error
    state = _unwrap_state_dict(state, path)
    expected = net.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mismatched = [key for key in expected if key in state and tuple(state[key].shape) != tuple(expected[key].shape)]
    if missing or unexpected or mismatched:
        problems = []
        if mismatched:
            key = mismatched[0]
            problems.append(
                f"{len(mismatched)} shape mismatches (e.g. {key}: checkpoint {list(state[key].shape)}, model {list(expected[key].shape)})"
            )
        if missing:
            problems.append(f"{len(missing)} missing keys (e.g. {missing[0]})")
        if unexpected:
            problems.append(f"{len(unexpected)} unexpected keys (e.g. {unexpected[0]})")
        raise VitcliError(f"checkpoint {path} does not match {name}: {'; '.join(problems)}")
    net.load_state_dict(state, strict=True)


def _unwrap_state_dict(state: Any, path: Path) -> dict[str, Tensor]:
    if isinstance(state, dict):
        for wrapper in ("state_dict", "model", "state_dict_ema"):
            if wrapper in state and isinstance(state[wrapper], dict):
                state = state[wrapper]
                break
    if not isinstance(state, dict) or not all(isinstance(value, Tensor) for value in state.values()):
        raise VitcliError(f"checkpoint {path} is not a state dict of tensors")
    return {key.removeprefix("module."): value for key, value in state.items()}


@dataclass(frozen=True)
class Architecture:
    """What a command may check before any weights load: the network's shape, its grid and its classes."""

    name: str
    depth: int
    num_heads: int
    embed_dim: int
    grid: PatchGrid
    num_classes: int
    labels: tuple[str, ...]
    global_pool: str


def describe(spec: WeightsSpec) -> Architecture:
    """The architecture's facts from timm's meta-device skeleton: no weights are read or downloaded."""
    skeleton = require_vit(spec.model_name)
    config = timm.data.resolve_data_config(model=skeleton)
    height, width = config["input_size"][1:]
    grid = PatchGrid(height, width, skeleton.patch_embed.patch_size[0], prefix_names(skeleton))
    subset = timm.data.infer_imagenet_subset(skeleton)
    labels = tuple(timm.data.ImageNetInfo(subset).label_descriptions()) if subset else ()
    if len(labels) != skeleton.num_classes:
        labels = tuple(f"class {index}" for index in range(skeleton.num_classes))
    return Architecture(
        spec.model_name,
        len(skeleton.blocks),
        skeleton.blocks[0].attn.num_heads,
        skeleton.embed_dim,
        grid,
        skeleton.num_classes,
        labels,
        skeleton.global_pool,
    )
