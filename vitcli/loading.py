"""Building a timm ViT and loading its weights: pretrained (HF cache or hub), a local checkpoint, or seeded random.

One load per process for the same arguments; every refusal is one line a person can act on. `describe` gives the
architecture facts (blocks, heads, grid, classes and their names) without loading any weights, so commands can check
their arguments first.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import pickle
import re
import socket
import urllib.request
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import timm
import torch
from timm.layers import PatchEmbed
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor

from vitcli.capture import BlockPlace, Family, family_of
from vitcli.classes import class_names
from vitcli.errors import UsageError, VitcliError
from vitcli.grid import PatchGrid
from vitcli.loading_towers import is_tower
from vitcli.model import VitModel
from vitcli.spec import WeightsSpec

WEIGHTS_HELP = (
    "connect to the internet once so timm can download them into the Hugging Face cache "
    "(later runs may set HF_HUB_OFFLINE=1 to use only the cache), "
    "pass --checkpoint PATH (a .safetensors, .pth or .pt state dict), "
    "or use --weights random --seed N for an untrained model"
)
# The safetensors metadata key under which vitcli records how it made a checkpoint (JSON).
RECORD_KEY = "vitcli"
# One TCP connection to the hub (or its proxy) tells within this time whether a download can work at all.
HUB_CONNECT_SECONDS = 5

_LOADED: dict[tuple[WeightsSpec, str, int], VitModel] = {}


# Measured with benchmarks/occlusion.py: on a 2-core CPU batches of 8-16 ran ViT-Tiny fastest, 32 up to 20% slower.
CPU_BATCH_SIZE = 8
ACCELERATOR_BATCH_SIZE = 64


@dataclass(frozen=True)
class Architecture:
    """What a command checks its arguments against before any weights load."""

    name: str
    depth: int
    num_heads: int
    embed_dim: int
    grid: PatchGrid
    num_classes: int  # 0: no classifier head (the model outputs pooled features)
    labels: tuple[str, ...]  # one name per class
    global_pool: str  # timm's pooling of the final tokens: "token" (CLS), "avg", "map", ...
    mlp_hidden: int = 0  # the width of a block's MLP hidden layer (fc1's outputs)
    family: str = "timm VisionTransformer"  # the family adapter's name (capture.family.Family.name)
    features: frozenset[str] = frozenset()  # what the family offers (capture.family.FEATURES), for the needs check
    family_refusal: str | None = None  # why its blocks cannot be taken apart at their sites, if they cannot

    places: tuple[BlockPlace, ...] = ()  # every block's stage, grid and heads (Swin's stages differ)

    def place(self, block: int) -> BlockPlace:
        """The place of one-based block `block`."""
        return self.places[block - 1]

    @property
    def staged(self) -> bool:
        """Whether the blocks attend over grids of their stage (Swin) rather than one grid."""
        return len({place.grid for place in self.places}) > 1

    @property
    def map_grid(self) -> PatchGrid:
        """VitModel.map_grid before the weights load: the input's grid, or the last stage's."""
        return self.places[-1].grid if self.staged else self.grid

    embedding_width: int = 0  # the pooled embedding's width (what a head reads; embedding targets score it)

    @property
    def longest_vector(self) -> int:
        """The most values any one vector of the forward has: a patch's pixels, a row, the MLP's hidden layer, or
        the logits. Options that show leading values are bounded by it."""
        return max(3 * self.grid.patch_size**2, self.embed_dim, self.mlp_hidden, self.num_classes)


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
            _load_state(net, state, spec.checkpoint, spec.model_name)
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
    skeleton = require_vit(spec.model_name)
    family = family_of(skeleton)
    num_classes = family.num_classes
    if not spec.random and spec.checkpoint is not None:
        num_classes = head_classes(_read_state(spec.checkpoint, values=False), skeleton)
    labels = class_names(spec, num_classes, getattr(skeleton, "pretrained_cfg", {}))
    return architecture_from(spec.model_name, family, num_classes, labels)


def architecture_from(name: str, family: Family, num_classes: int, labels: tuple[str, ...]) -> Architecture:
    """The facts of a family adapter's net (a skeleton or a loaded model) whose head has `num_classes` classes (a
    checkpoint's head may have another number than the architecture's own, or none)."""
    from vitcli.capture.support import family_features

    features = family_features(family) - {"class_head"} | ({"class_head"} if num_classes else set())
    return Architecture(
        name=name,
        depth=len(family.blocks()),
        num_heads=heads_of(family),
        embed_dim=family.width,
        grid=family.grid(),
        num_classes=num_classes,
        labels=labels,
        global_pool=family.pooling,
        mlp_hidden=mlp_hidden_width(family),
        family=family.name,
        features=frozenset(features),
        family_refusal=family.refusal(),
        # A family's places need its standard blocks; a refused family still names its depth and heads.
        places=tuple(family.places()) if family.refusal() is None else (),
        embedding_width=embedding_width(family.net),
    )


def mlp_hidden_width(family: Family) -> int:
    fc1 = getattr(getattr(family.blocks()[0], "mlp", None), "fc1", None)
    return int(getattr(fc1, "out_features", 4 * family.width))


def heads_of(family: Family) -> int:
    """Block 1's heads: from the family's places, or of a refused family (whose blocks have no places) from the first
    module of block 1 that names them."""
    if family.refusal() is None:
        return family.places()[0].heads
    return next((module.num_heads for module in family.blocks()[0].modules() if hasattr(module, "num_heads")), 0)


def embedding_width(net: torch.nn.Module) -> int:
    """The width of the pooled embedding a classifier head reads (timm's pre-logits features)."""
    return getattr(net, "head_hidden_size", None) or net.num_features


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


# ----- checkpoints


def head_classes(state: Mapping[str, Tensor], net: torch.nn.Module) -> int:
    """The classes of a state dict's classifier head for `net`'s architecture; no head means a headless model
    (timm's num_classes=0)."""
    head = state.get(f"{classifier_name(net)}.weight")
    return int(head.shape[0]) if head is not None else 0


def classifier_name(net: torch.nn.Module) -> str:
    """Where the classifier Linear sits in `net`'s state dict: `head` on a ViT, `head.fc` on Swin (timm's
    get_classifier; an Identity when headless, at the same place); `head` on the towers, which have none."""
    if not hasattr(net, "get_classifier"):
        return "head"
    classifier = net.get_classifier()
    if isinstance(classifier, tuple):  # a distilled DeiT's (head, head_dist): the class token's head
        classifier = classifier[0]
    return next(name for name, module in net.named_modules() if module is classifier)


def read_checkpoint(path: Path) -> dict[str, Tensor]:
    """A checkpoint's state dict on the CPU, refused when a tensor holds NaN or infinite values."""
    state = _read_state(path, values=True)
    for name in sorted(state):
        tensor = state[name]
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            nan, infinite = int(tensor.isnan().sum()), int(tensor.isinf().sum())
            raise VitcliError(
                f"checkpoint {path}: tensor {name} has {nan} NaN and {infinite} infinite values among "
                f"{tensor.numel()} (the first such tensor by name); such weights give meaningless outputs"
            )
    return state


def read_record(path: Path) -> dict[str, Any] | None:
    """What a checkpoint vitcli wrote records about its making (the `vitcli` key of a safetensors file's metadata,
    JSON); None for torch files, other safetensors files, and a record that is not a JSON object."""
    if _checkpoint_kind(path) != "safetensors":
        return None
    from safetensors import safe_open

    with safe_open(str(path), "pt") as file:
        text = (file.metadata() or {}).get(RECORD_KEY)
    try:
        record = json.loads(text) if text is not None else None
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def load_checkpoint(net: torch.nn.Module, path: Path, name: str) -> None:
    """Load a .safetensors file or a .pth/.pt state dict (tensors only, never pickled objects), strictly."""
    _load_state(net, read_checkpoint(path), path, name)


def _checkpoint_kind(path: Path) -> str:
    """'safetensors' or 'torch', told from the first bytes (so any suffix, in any letter case, works)."""
    if path.is_dir():
        raise VitcliError(f"checkpoint {path} is a folder, not a file")
    if not path.is_file():
        raise VitcliError(f"checkpoint not found: {path}")
    try:
        with path.open("rb") as handle:
            start = handle.read(9)
    except OSError as error:
        raise VitcliError(f"cannot read checkpoint {path}: {(error.strerror or str(error)).lower()}") from error
    if not start:
        raise VitcliError(f"checkpoint {path} is empty")
    # torch.save writes a zip archive (a pickle before torch 1.6); safetensors an 8-byte length, then a JSON header.
    if start.startswith(b"PK\x03\x04") or start.startswith(b"\x80"):
        return "torch"
    if start[8:9] == b"{":
        return "safetensors"
    raise VitcliError(f"checkpoint {path} is neither a safetensors file nor a torch state dict (.pth/.pt)")


# torch.load(weights_only=True) refuses with one exception type both bytes that are no pickle and a pickle that asks
# for objects beyond tensors (a global to import, a function to call, a class to build). Only these two texts of its
# weights-only unpickler mean broken bytes; every other refusal is an object vitcli will not run.
DAMAGED_PICKLE = re.compile(r"Unsupported operand (\d+)|String is too long")
# The object torch names: "GLOBAL posix.system" (a blocked module or a global not allowed), "got <class 'x.Y'>".
PICKLED_OBJECT = re.compile(r"GLOBAL ([\w.]+)|<class '([\w.]+)'>")


def _read_state(path: Path, values: bool) -> dict[str, Tensor]:
    """The state dict of a checkpoint; with values=False only its header: tensors on the meta device (shapes)."""
    kind = _checkpoint_kind(path)
    try:
        if kind == "safetensors":
            from safetensors import safe_open
            from safetensors.torch import load_file

            if values:
                state = load_file(str(path))
            else:
                with safe_open(str(path), "pt") as file:
                    state = {key: torch.empty(file.get_slice(key).get_shape(), device="meta") for key in file.keys()}
        else:
            with warnings.catch_warnings():
                # A damaged pickle makes torch warn about its "protocol" before failing: the error says enough.
                warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)
                state = torch.load(path, map_location="cpu" if values else "meta", weights_only=True)
    except MemoryError:  # a full memory says nothing about the file
        raise
    except pickle.UnpicklingError as error:
        if DAMAGED_PICKLE.search(str(error)):
            raise VitcliError(f"cannot read checkpoint {path}: {_pickle_damage(str(error))}") from error
        found = PICKLED_OBJECT.search(str(error))
        named = f" ({found.group(found.lastindex or 0)})" if found else ""
        raise VitcliError(
            f"cannot read checkpoint {path}: it holds pickled Python objects{named} besides tensors, "
            "which vitcli will not run; save only the state dict"
        ) from error
    except Exception as error:
        raise VitcliError(f"cannot read checkpoint {path}: the {kind} file is damaged or truncated") from error
    return _unwrap_state_dict(state, path)


def _pickle_damage(text: str) -> str:
    """Broken bytes, or a real pickle instruction the weights-only loader does not read (protocol 4's FRAME...)."""
    import pickletools

    operand = DAMAGED_PICKLE.search(text)
    code = int(operand.group(1)) if operand and operand.group(1) else None
    known = [opcode for opcode in pickletools.opcodes if ord(opcode.code) == code]
    if not known:
        return "the torch file is damaged or truncated"
    return (
        f"it uses the pickle instruction {known[0].name} (protocol {known[0].proto}), which torch's weights-only "
        "loader does not read; save the state dict again with torch.save's default protocol"
    )


def _load_state(net: torch.nn.Module, state: dict[str, Tensor], path: Path, name: str) -> None:
    expected = net.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mismatched = [key for key in expected if key in state and tuple(state[key].shape) != tuple(expected[key].shape)]
    if missing or unexpected or mismatched:
        problems = []
        if mismatched:
            key = mismatched[0]
            checkpoint_shape, model_shape = list(state[key].shape), list(expected[key].shape)
            problems.append(
                f"{len(mismatched)} shape mismatches (e.g. {key}: checkpoint {checkpoint_shape}, model {model_shape})"
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
        problem = _hub_connection_problem(constants.ENDPOINT)
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


def _hub_connection_problem(endpoint: str) -> str | None:
    """Why no TCP connection can be made to the hub, or to the proxy the hub client would use; None if one can."""
    url = urlparse(endpoint)
    host, port = url.hostname or endpoint, url.port or (443 if url.scheme == "https" else 80)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(url.scheme) or proxies.get("all")
    via = ""
    if proxy and not urllib.request.proxy_bypass_environment(host, proxies):
        proxy_url = urlparse(proxy if "://" in proxy else f"http://{proxy}")
        host, port = proxy_url.hostname or proxy, proxy_url.port or (443 if proxy_url.scheme == "https" else 80)
        via = f"the proxy {proxy}: "
    try:
        socket.create_connection((host, port), timeout=HUB_CONNECT_SECONDS).close()
    except TimeoutError:
        return f"{via}no answer within {HUB_CONNECT_SECONDS} s"
    except OSError as error:
        return f"{via}{(error.strerror or 'no connection').lower()}"
    return None
