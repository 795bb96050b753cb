"""Every bad input vitcli refuses, from one table that tests/BAD_INPUTS.md mirrors row for row.

Each case builds its input in a fresh folder and returns (message, exit code) of the refusal. A refusal is one line
a person can act on: the fragments listed in the table, no traceback, no bare number, no exception class name,
the exit code of its kind (2 usage, 1 runtime), and it comes within REFUSAL_SECONDS.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitcli.errors import VitcliError
from vitcli.spec import WeightsSpec
from vitcli.text_bank import read_text_bank

BAD_INPUTS_MD = Path(__file__).with_name("BAD_INPUTS.md")
MODEL = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
# Generous: the slowest refusal (an unreachable hub) measured well under 10 s; a hub client's retries take ~50 s.
REFUSAL_SECONDS = 30


@dataclass(frozen=True)
class BadInput:
    input: str  # the first column of BAD_INPUTS.md, word for word
    message: tuple[str, ...]  # fragments the one-line message must contain
    exit_code: int
    run: Callable[[Path], tuple[str, int]]  # builds the input under a temp folder; returns (message, exit code)
    slow: bool = False


def refusal(action: Callable[[], object]) -> tuple[str, int]:
    """The message and exit code of the VitcliError an in-process action raises."""
    try:
        action()
    except VitcliError as error:
        return str(error), error.exit_code
    raise AssertionError("the input was accepted")


def in_subprocess(code: str, env: dict[str, str]) -> tuple[str, int]:
    """Run `code` in a fresh interpreter (huggingface_hub reads its environment at import); its stderr and code."""
    script = (
        "import sys\nfrom vitcli.errors import VitcliError\n"
        f"try:\n    {code}\n"
        "except VitcliError as error:\n    print(error, file=sys.stderr)\n    sys.exit(error.exit_code)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    return done.stderr.rstrip("\n"), done.returncode


def hub_env(tmp: Path, **settings: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("HF_") and "proxy" not in key.lower()}
    return {**env, "HF_HOME": str(tmp / "hf-home"), **settings}


# ----- builders


def image_file(tmp: Path, name: str, fmt: str = "JPEG") -> Path:
    path = tmp / name
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(path, format=fmt)
    return path


def cut_in_half(path: Path) -> Path:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def sparse_file(path: Path, size: int) -> Path:
    with path.open("wb") as handle:
        handle.truncate(size)
    return path


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_header_only(path: Path, width: int, height: int) -> Path:
    """A PNG declaring width x height RGB pixels in its IHDR chunk, with the pixel data of one row only."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    pixels = zlib.compress(bytes(1 + 3 * 16))
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", pixels) + png_chunk(b"IEND", b"")
    )
    return path


def tiny_state() -> dict[str, torch.Tensor]:
    """ViT-Tiny's state dict with seeded random values (real names and shapes, no model kept)."""
    import timm

    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False).state_dict()


def safetensors_file(path: Path, state: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    save_file({name: tensor.contiguous() for name, tensor in state.items()}, path)
    return path


def with_value(name: str, value: float) -> dict[str, torch.Tensor]:
    state = tiny_state()
    state["pos_embed"][0, 5, 7] = value  # a later name holding a bad value too: the first in name order is named
    state[name][0] = value
    return state


def load_checkpoint_spec(path: Path, labels: Path | None = None) -> Callable[[], object]:
    from vitcli.loading import load_model

    return lambda: load_model(WeightsSpec(model_name=MODEL, checkpoint=path, labels=labels), "cpu")


def two_class_checkpoint(tmp: Path) -> Path:
    state = tiny_state()
    state["head.weight"], state["head.bias"] = state["head.weight"][:2].clone(), state["head.bias"][:2].clone()
    return safetensors_file(tmp / "probe.safetensors", state)


def labels_file(tmp: Path, name: str, content: bytes) -> Path:
    path = tmp / name
    path.write_bytes(content)
    return path


def torch_file(path: Path, content: object) -> Path:
    torch.save(content, path)
    return path


def torch_protocol_4(path: Path, content: object) -> Path:
    torch.save(content, path, pickle_protocol=4)
    return path


class CallsOnLoad:
    """Pickles as a call of `function` (os.getcwd: harmless, and from a module torch blocks, like os.system)."""

    def __init__(self, function: Callable[[], object]) -> None:
        self.function = function

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return self.function, ()


def two_class_checkpoint_beside(tmp: Path, labels: bytes) -> Path:
    labels_file(tmp, "labels.txt", labels)
    return two_class_checkpoint(tmp)


def load_rgb(path: Path) -> Callable[[], object]:
    from vitcli.images import load_rgb as load

    return lambda: load(path)


def read_mask(path: Path) -> Callable[[], object]:
    from vitcli.experiments.localisation import read_mask as read

    return lambda: read(path)


def resolve(*arguments: str) -> Callable[[], object]:
    from vitcli.images import resolve_images

    return lambda: resolve_images(list(arguments))


def empty_folder(tmp: Path) -> Path:
    folder = tmp / "empty"
    folder.mkdir()
    (folder / "notes.txt").write_text("no images here")
    return folder


def load_spec(**fields: object) -> Callable[[], object]:
    from vitcli.loading import load_model

    return lambda: load_model(WeightsSpec(**fields), "cpu")


# ----- the table (tests/BAD_INPUTS.md mirrors it)

CASES: list[BadInput] = [
    # images
    BadInput(
        "a 1 GiB file of zeros named `.jpg`",
        ("is not an image that Pillow can read as", "JPEG"),
        1,
        lambda tmp: refusal(load_rgb(sparse_file(tmp / "zeros.jpg", 1 << 30))),
    ),
    BadInput(
        "a text file named `.png`",
        ("is not an image that Pillow can read as",),
        1,
        lambda tmp: refusal(load_rgb(labels_file(tmp, "notes.png", b"just some text\n"))),
    ),
    BadInput(
        "an image in a format outside the list (TGA)",
        ("is not an image that Pillow can read as", "JPEG, PNG"),
        1,
        lambda tmp: refusal(load_rgb(image_file(tmp, "photo.tga", "TGA"))),
    ),
    BadInput(
        "a JPEG cut in half",
        ("is damaged or truncated",),
        1,
        lambda tmp: refusal(load_rgb(cut_in_half(image_file(tmp, "half.jpg")))),
    ),
    BadInput(
        "a PNG header declaring 100000 x 100000 pixels",
        ("is too large to decode safely",),
        1,
        lambda tmp: refusal(load_rgb(png_header_only(tmp / "bomb.png", 100_000, 100_000))),
    ),
    BadInput(
        "an image path that does not exist",
        ("no such file or directory",),
        1,
        lambda tmp: refusal(resolve(str(tmp / "missing.jpg"))),
    ),
    BadInput(
        "a directory without images",
        ("no images in directory",),
        1,
        lambda tmp: refusal(resolve(str(empty_folder(tmp)))),
    ),
    BadInput(
        "a glob that matches nothing",
        ("no files match",),
        1,
        lambda tmp: refusal(resolve(str(tmp / "*.jpg"))),
    ),
    # checkpoints
    BadInput(
        "a checkpoint path that does not exist",
        ("checkpoint not found",),
        1,
        lambda tmp: refusal(load_checkpoint_spec(tmp / "missing.safetensors")),
    ),
    BadInput(
        "a checkpoint path that is a folder",
        ("is a folder",),
        1,
        lambda tmp: refusal(load_checkpoint_spec(empty_folder(tmp))),
    ),
    BadInput(
        "an empty `.pth`",
        ("is empty",),
        1,
        lambda tmp: refusal(load_checkpoint_spec(labels_file(tmp, "empty.pth", b""))),
    ),
    BadInput(
        "a `.pth` of text",
        ("neither a safetensors file nor a torch state dict",),
        1,
        lambda tmp: refusal(load_checkpoint_spec(labels_file(tmp, "junk.pth", b"hello world, not weights"))),
    ),
    BadInput(
        "a 1 GiB `.safetensors` of zeros",
        ("neither a safetensors file nor a torch state dict",),
        1,
        lambda tmp: refusal(load_checkpoint_spec(sparse_file(tmp / "zeros.safetensors", 1 << 30))),
    ),
    BadInput(
        "a torch `.pth` cut in half",
        ("is damaged or truncated",),
        1,
        lambda tmp: refusal(load_checkpoint_spec(cut_in_half(torch_file(tmp / "w.pth", tiny_state())))),
    ),
    BadInput(
        "a `.safetensors` cut in half",
        ("is damaged or truncated",),
        1,
        lambda tmp: refusal(load_checkpoint_spec(cut_in_half(safetensors_file(tmp / "w.safetensors", tiny_state())))),
    ),
    BadInput(
        "a `.pth` holding pickled Python objects",
        ("pickled Python objects", "numpy.dtype"),
        1,
        lambda tmp: refusal(
            load_checkpoint_spec(torch_file(tmp / "evil.pth", {"model": tiny_state(), "dtype": np.dtype("float32")}))
        ),
    ),
    BadInput(
        "a `.pth` holding a list, not a state dict",
        ("is not a state dict of tensors",),
        1,
        lambda tmp: refusal(load_checkpoint_spec(torch_file(tmp / "list.pth", [torch.zeros(1)]))),
    ),
    BadInput(
        "a checkpoint with NaN values",
        ("blocks.1.norm1.weight", "NaN"),
        1,
        lambda tmp: refusal(
            load_checkpoint_spec(safetensors_file(tmp / "nan.safetensors", with_value("blocks.1.norm1.weight", np.nan)))
        ),
    ),
    BadInput(
        "a checkpoint with infinite values",
        ("blocks.0.attn.qkv.bias", "infinite"),
        1,
        lambda tmp: refusal(
            load_checkpoint_spec(
                safetensors_file(tmp / "inf.safetensors", with_value("blocks.0.attn.qkv.bias", np.inf))
            )
        ),
    ),
    BadInput(
        "a checkpoint whose shapes do not match the model",
        ("does not match", "pos_embed: checkpoint [1, 50, 192], model [1, 197, 192]"),
        1,
        lambda tmp: refusal(
            load_checkpoint_spec(
                safetensors_file(tmp / "wrong.safetensors", {**tiny_state(), "pos_embed": torch.zeros(1, 50, 192)})
            )
        ),
    ),
    # labels
    BadInput(
        "`--labels` with 3 names for a 2-class head",
        ("has 3 names", "2 classes"),
        1,
        lambda tmp: refusal(load_checkpoint_spec(two_class_checkpoint(tmp), labels_file(tmp, "l.txt", b"a\nb\nc\n"))),
    ),
    BadInput(
        "a `labels.txt` beside the checkpoint with 1 name for a 2-class head",
        ("labels.txt has 1 name but", "2 classes"),
        1,
        lambda tmp: refusal(load_checkpoint_spec(two_class_checkpoint_beside(tmp, b"a\n"))),
    ),
    BadInput(
        "a labels file that is not UTF-8",
        ("is not UTF-8 text",),
        1,
        lambda tmp: refusal(
            load_checkpoint_spec(two_class_checkpoint(tmp), labels_file(tmp, "l.txt", b"caf\xe9\ntea\n"))
        ),
    ),
    BadInput(
        "a labels file that does not exist",
        ("labels file not found",),
        1,
        lambda tmp: refusal(load_checkpoint_spec(two_class_checkpoint(tmp), tmp / "missing.txt")),
    ),
    # models and seeds: usage errors, before any weights load
    BadInput(
        "an unknown model name (`vit_tiny_patch16_244`)",
        ("unknown model name", "did you mean vit_tiny_patch16_224"),
        2,
        lambda tmp: refusal(load_spec(model_name="vit_tiny_patch16_244")),
    ),
    BadInput(
        "an unknown pretrained tag (`vit_tiny_patch16_224.nope`)",
        ("unknown pretrained tag 'nope'", "augreg_in21k_ft_in1k"),
        2,
        lambda tmp: refusal(load_spec(model_name="vit_tiny_patch16_224.nope")),
    ),
    BadInput(
        "a model that is not a ViT (`resnet18`)",
        ("not a Vision Transformer",),
        2,
        lambda tmp: refusal(load_spec(model_name="resnet18", random=True)),
    ),
    BadInput(
        "`--seed 18446744073709551616` (2^64)",
        ("--seed", "-9223372036854775808 to 18446744073709551615"),
        2,
        lambda tmp: refusal(lambda: WeightsSpec(random=True, seed=2**64)),
    ),
    BadInput(
        "`--seed -9223372036854775809` (-2^63 - 1)",
        ("--seed", "-9223372036854775808 to 18446744073709551615"),
        2,
        lambda tmp: refusal(lambda: WeightsSpec(random=True, seed=-(2**63) - 1)),
    ),
    # the Hugging Face hub, in a fresh process with an empty cache
    BadInput(
        "pretrained weights, empty cache, `HF_HUB_OFFLINE=1`",
        ("not in the Hugging Face cache", "HF_HUB_OFFLINE=1", "--checkpoint"),
        1,
        lambda tmp: in_subprocess(
            "from vitcli.spec import WeightsSpec; from vitcli.loading import load_model; load_model(WeightsSpec())",
            hub_env(tmp, HF_HUB_OFFLINE="1"),
        ),
        slow=True,
    ),
    BadInput(
        "pretrained weights, empty cache, `HF_ENDPOINT=http://127.0.0.1:9` (refuses connections)",
        ("cannot be reached", "HF_HUB_OFFLINE", "--checkpoint"),
        1,
        lambda tmp: in_subprocess(
            "from vitcli.spec import WeightsSpec; from vitcli.loading import load_model; load_model(WeightsSpec())",
            hub_env(tmp, HF_ENDPOINT="http://127.0.0.1:9"),
        ),
        slow=True,
    ),
    BadInput(
        "pretrained weights, empty cache, `HTTPS_PROXY=http://127.0.0.1:9` (refuses connections)",
        ("cannot be reached (the proxy http://127.0.0.1:9: connection refused)", "HF_HUB_OFFLINE", "--checkpoint"),
        1,
        lambda tmp: in_subprocess(
            "from vitcli.spec import WeightsSpec; from vitcli.loading import load_model; load_model(WeightsSpec())",
            hub_env(tmp, HTTPS_PROXY="http://127.0.0.1:9"),
        ),
        slow=True,
    ),
    # checkpoints whose pickle would run code, or that no longer reads
    BadInput(
        "a `.pth` whose pickle would call `os.getcwd` (a module torch blocks, like `os.system`)",
        ("pickled Python objects (posix.getcwd)", "which vitcli will not run"),
        1,
        lambda tmp: refusal(
            load_checkpoint_spec(torch_file(tmp / "runs.pth", {"model": tiny_state(), "x": CallsOnLoad(os.getcwd)}))
        ),
    ),
    BadInput(
        "a `.pth` whose pickle would call `print` (a global torch does not allow)",
        ("pickled Python objects (print)", "which vitcli will not run"),
        1,
        lambda tmp: refusal(
            load_checkpoint_spec(torch_file(tmp / "runs.pth", {"model": tiny_state(), "x": CallsOnLoad(print)}))
        ),
    ),
    BadInput(
        "a `.pth` pickle with a byte that is no pickle instruction",
        ("is damaged or truncated",),
        1,
        lambda tmp: refusal(load_checkpoint_spec(labels_file(tmp, "garbled.pth", b"\x80\x02}q\x00\xff."))),
    ),
    BadInput(
        "a `.pth` saved with pickle protocol 4",
        ("pickle instruction FRAME (protocol 4)", "torch.save's default protocol"),
        1,
        lambda tmp: refusal(load_checkpoint_spec(torch_protocol_4(tmp / "p4.pth", tiny_state()))),
    ),
    # explain's masks: read as safely as images
    BadInput(
        "an `explain --masks` mask whose PNG header declares 100000 x 100000 pixels",
        ("the mask", "is too large to decode safely"),
        1,
        lambda tmp: refusal(read_mask(png_header_only(tmp / "bomb.png", 100_000, 100_000))),
    ),
    BadInput(
        "a labels file with a U+2028 line separator inside a name",
        ("labels file", "line 1 holds a line break or control character (U+2028)"),
        1,
        lambda tmp: refusal(
            load_checkpoint_spec(two_class_checkpoint(tmp), labels_file(tmp, "l.txt", "cat\u2028dog\ntea\n".encode()))
        ),
    ),
    # heads' text bank
    BadInput(
        "a `heads --texts` bank of blank lines only",
        ("--texts", "holds no text: write one text per line"),
        2,
        lambda tmp: refusal(lambda: read_text_bank(labels_file(tmp, "bank.txt", b"\n   \n\t\n"))),
    ),
    BadInput(
        "a `heads --texts` bank in Latin-1 (not UTF-8)",
        ("--texts", "is not UTF-8 text (at byte offset 5)", "save it as UTF-8"),
        2,
        lambda tmp: refusal(lambda: read_text_bank(labels_file(tmp, "bank.txt", "a caf\u00e9\n".encode("latin-1")))),
    ),
    # one source of weights, whichever front end builds the spec (the API's load_model and run configs included)
    BadInput(
        "a weights spec with a checkpoint and random weights",
        ("--checkpoint and --weights random contradict each other", "choose one source of weights"),
        2,
        lambda tmp: refusal(lambda: WeightsSpec(random=True, checkpoint=tmp / "w.safetensors")),
    ),
]

# No "KeyError", "EOFError", "UnpicklingError"...: people cannot act on a class name.
EXCEPTION_NAME = re.compile(r"\b[A-Z]\w*(Error|Exception)\b")


@pytest.mark.parametrize(
    "case",
    [pytest.param(case, id=case.input, marks=[pytest.mark.slow] if case.slow else []) for case in CASES],
)
def test_bad_input_is_refused_with_one_clear_line(case: BadInput, tmp_path):
    started = time.perf_counter()
    message, exit_code = case.run(tmp_path)
    elapsed = time.perf_counter() - started
    assert exit_code == case.exit_code, message
    assert "\n" not in message and "Traceback" not in message, message
    for fragment in case.message:
        assert fragment in message
    assert not EXCEPTION_NAME.search(message), message
    assert not re.search(r":\s*\d+$", message) and not message.strip().isdigit(), message
    assert elapsed < REFUSAL_SECONDS


def test_bad_inputs_md_mirrors_the_table():
    rows = []
    for line in BAD_INPUTS_MD.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 3 and cells[2].isdigit():
            rows.append((cells[0], tuple(re.findall(r"`([^`]*)`", cells[1])), int(cells[2])))
    assert rows == [(case.input, case.message, case.exit_code) for case in CASES]
