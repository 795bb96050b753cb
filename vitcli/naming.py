"""The output naming scheme, in one place: which folder a result lands in and what its files are called.

    OUTPUT_DIR / MODEL / SUBJECT / RESULT.{json,csv,png,...}

- MODEL names the network and its weights: `vit_tiny_patch16_224.augreg_in21k_ft_in1k` (pretrained),
  `vit_tiny_patch16_224.augreg_in21k_ft_in1k-random-s0`, `...-ckpt-probe-1a2b3c4d` (checkpoint stem and the first
  8 hex digits of its SHA-256). Results of different weights never share a folder.
- SUBJECT is what the result is about: one folder per distinct input file, `STEM-HASH` where HASH is the first 10 hex
  digits of the SHA-256 of the file's resolved absolute path, so `a/x.jpg` and `b/x.jpg` never collide and a re-run
  finds the same folder from any working directory; an image set is `set-HASH` (of the sorted resolved paths);
  results about the model alone go in `model`.
- RESULT is the experiment's kind followed by the settings that made it, e.g. `attention-b4-h1-q74`,
  `occlusion-patches-s16-st16-gray-ttop1`: two runs with different settings never overwrite each other, and the same
  command run twice replaces exactly its own files. Jobs build it from their settings as parsed (block numbers,
  patch numbers, class indexes), never from the text typed, so equal settings spelled two ways share one name. A
  name longer than LONGEST_RESULT_NAME is cut and ends with `-` and 8 hex digits of the SHA-256 of the whole
  name, so settings that differ after the cut still get names of their own.

Every name derived from user input is sanitized: ASCII letters, digits, `.`, `_` and `-` only, no leading dot,
no separators or control characters, at most 80 characters.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from vitcli.filenames import escaped_path

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_LONGEST = 80
LONGEST_RESULT_NAME = 120  # the whole stem; each file adds a suffix (.json, -across-images.csv)
_HASH_DIGITS = 8
MODEL_SUBJECT = "model"


def safe_name(text: str, fallback: str = "unnamed") -> str:
    """A file-name component made from arbitrary text: never empty, never hidden, never a path."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    # Dots and underscores together: stripping "_" after "." would turn "_.x" into the hidden ".x".
    cleaned = _UNSAFE.sub("_", ascii_text).lstrip("._").rstrip("_") or fallback
    return cleaned[:_LONGEST]


def _canonical(path: Path) -> str:
    # resolve(), not absolute(): `../photos/x.jpg` from a sub-folder is the same file as `photos/x.jpg` from here,
    # and must find the same folder on every run.
    return str(path.resolve())


def path_hash(path: Path, digits: int = 10) -> str:
    return hashlib.sha256(_canonical(path).encode("utf-8", "surrogateescape")).hexdigest()[:digits]


def image_subject(path: Path) -> str:
    """The folder of one input file: its sanitized stem (a byte that is not UTF-8 as `_xHH`) and a hash of its
    absolute path."""
    return f"{safe_name(escaped_path(path.stem), 'image')}-{path_hash(path)}"


def set_subject(paths: Iterable[Path]) -> str:
    """The folder of a result about several images together (order does not matter)."""
    joined = "\n".join(sorted(_canonical(path) for path in paths))
    return f"set-{hashlib.sha256(joined.encode('utf-8', 'surrogateescape')).hexdigest()[:10]}"


def model_folder(
    model_name: str, random: bool, seed: int, checkpoint: Path | None, checkpoint_sha256: str | None
) -> str:
    """The folder naming the network and where its weights came from."""
    name = safe_name(model_name, "model")
    if model_name.startswith("hf:"):  # a folder: its name and a hash of where it lies, so two never share outputs
        folder = Path(model_name.removeprefix("hf:")).expanduser()
        name = f"hf_{safe_name(folder.resolve().name, 'model')}-{path_hash(folder)}"
    if random:
        return f"{name}-random-s{seed}"
    if checkpoint is not None:
        return f"{name}-ckpt-{safe_name(checkpoint.stem, 'checkpoint')}-{(checkpoint_sha256 or '')[:8]}"
    return name


def setting(prefix: str, value: Any) -> str | None:
    """One setting as a name part: ('b', 4) -> 'b4', ('t', ['P1', 'P2']) -> 'tP1_P2'; None is left out.

    Distinct values give distinct parts: a float is written so that it reads back as itself (0.1 and 0.1 + 1e-12
    differ), and text that sanitizing would change (spaces, accents, slashes) keeps a hash of itself."""
    if value is None:
        return None
    if isinstance(value, bool):
        return prefix if value else None
    if isinstance(value, (list, tuple)):
        value = "_".join(_text(item) for item in value)
    text = _text(value)
    cleaned = _UNSAFE.sub("_", text)
    if cleaned != text or cleaned.startswith("."):
        cleaned = f"{cleaned.strip('._')}_{_digest(text)}"
    return f"{prefix}{cleaned}"


def _text(value: Any) -> str:
    if isinstance(value, float):
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    return str(value)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:_HASH_DIGITS]


def result_name(kind: str, *parts: str | None) -> str:
    """`kind-part-part...`, skipping absent parts: the stem of every file of one result, at most
    LONGEST_RESULT_NAME characters (a longer one is cut and ends with a hash of all of it)."""
    name = "-".join([kind, *(part for part in parts if part)])
    if len(name) <= LONGEST_RESULT_NAME:
        return name
    kept = name[: LONGEST_RESULT_NAME - _HASH_DIGITS - 1].rstrip("._-")
    return f"{kept}-{_digest(name)}"
