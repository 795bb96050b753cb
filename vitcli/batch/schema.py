"""The shapes of a run's JSON, in one place: record lines (vitcli.batch.record) and manifests (vitcli.batch.manifest)
are checked whole, nested keys included, before anything reads them, so a damaged line or manifest is one message
naming its key (`config.images[0]: must be text, not a list`), never an internal error further on.

A shape is a Python type or a tuple of types (`str`, `(str, NoneType)`; a number never accepts true/false), or one
of `ListOf`, `Object` and `Matching` below. Objects may hold keys the shape does not name (later versions add some).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

NoneType = type(None)
NUMBER = (int, float)
_WORDS = {str: "text", dict: "an object", list: "a list", int: "a number", float: "a number", NoneType: "null"}


def problem(value: Any, shape: Any, where: str = "") -> str | None:
    """What is wrong with `value`, as `KEY: must be ..., not ...` (KEY its path from the top), or None."""
    if isinstance(shape, (ListOf, Object, Matching)):
        return shape.problem(value, where)
    kinds = shape if isinstance(shape, tuple) else (shape,)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        return _must(where, " or ".join(dict.fromkeys(_WORDS[kind] for kind in kinds)), value)
    return None


@dataclass(frozen=True)
class ListOf:
    item: Any
    words: str  # what the list holds, for the message: "a list of {words}"

    def problem(self, value: Any, where: str) -> str | None:
        if not isinstance(value, list):
            return _must(where, f"a list of {self.words}", value)
        for index, item in enumerate(value):
            found = problem(item, self.item, f"{where}[{index}]")
            if found:
                return found
        return None


@dataclass(frozen=True)
class Object:
    keys: dict[str, Any]
    optional: tuple[str, ...] = field(default=())

    def problem(self, value: Any, where: str) -> str | None:
        if not isinstance(value, dict):
            return _must(where, "an object", value)
        for key, shape in self.keys.items():
            inner = f"{where}.{key}" if where else key
            if key not in value:
                if key in self.optional:
                    continue
                return f"{inner}: missing"
            found = problem(value[key], shape, inner)
            if found:
                return found
        return None


@dataclass(frozen=True)
class Matching:
    """Text of a given form (a shard's `K/N`), or null where `null`."""

    pattern: str
    words: str
    null: bool = False

    def problem(self, value: Any, where: str) -> str | None:
        if isinstance(value, str) and re.fullmatch(self.pattern, value) or self.null and value is None:
            return None
        return _must(where, self.words, value)


def _must(where: str, words: str, value: Any) -> str:
    found = "true/false" if isinstance(value, bool) else _WORDS.get(type(value), type(value).__name__)
    if isinstance(value, str) and len(value) <= 40:
        found = repr(value)
    return f"{where + ': ' if where else ''}must be {words}, not {found}"


SHARD = Matching(r"[1-9][0-9]*/[1-9][0-9]*", "null or a shard K/N", null=True)
CONFIG = Object(
    {
        "path": str,
        "name": str,
        "images": ListOf(str, "image paths (text)"),
        "model": dict,
        "experiments": ListOf(dict, "objects"),
    },
    optional=("path", "name", "images", "model", "experiments"),
)
RESULT = Object(
    {
        "image": (str, NoneType),
        "image_sha256": (str, NoneType),
        "subject": str,
        "experiment": str,
        "command": str,
        "settings": dict,
        "files": ListOf(str, "file paths"),
        "compute_seconds": NUMBER,
        "write_seconds": NUMBER,
        "summary": dict,
    }
)
FAILURE = Object({"image": str, "experiment": (str, NoneType), "error": str})
RUN = Object(
    {
        "name": str,
        "identity": str,
        "shard": SHARD,
        "config": CONFIG,
        "provenance": dict,
        "result_names": ListOf(str, "result names (text)"),
        "host": str,
        "pid": int,
        "started": str,
    },
    optional=("result_names", "host", "pid", "started"),
)
MANIFEST = Object(
    {
        "name": str,
        "identity": str,
        "config": CONFIG,
        "provenance": dict,
        "shard": SHARD,
        "runs": ListOf(dict, "objects"),
        "result_names": ListOf(str, "result names (text)"),
        "results": ListOf(RESULT, "objects"),
        "failures": ListOf(FAILURE, "objects"),
        "not_in_this_run": ListOf(str, "image paths (text)"),
    },
    optional=("runs", "result_names", "results", "failures", "not_in_this_run"),
)
