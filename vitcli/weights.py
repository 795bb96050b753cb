"""Reading weights: checkpoint files (safetensors or torch state dicts, tensors only, checked whole) and whether the
Hugging Face hub can be reached before a download is tried."""

from __future__ import annotations

import json
import pickle
import re
import socket
import urllib.request
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch import Tensor

from vitcli.errors import VitcliError

# The safetensors metadata key under which vitcli records how it made a checkpoint (JSON).
RECORD_KEY = "vitcli"
# One TCP connection to the hub (or its proxy) tells within this time whether a download can work at all.
HUB_CONNECT_SECONDS = 5


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
    state = read_state(path, values=True)
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
    load_state(net, read_checkpoint(path), path, name)


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


def read_state(path: Path, values: bool) -> dict[str, Tensor]:
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


def load_state(net: torch.nn.Module, state: dict[str, Tensor], path: Path, name: str) -> None:
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


def hub_connection_problem(endpoint: str) -> str | None:
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
