"""File names as text that every output can hold, and back.

A file system gives names as bytes. Python decodes a name that is not UTF-8 (a Latin-1 file system, an unpacked
archive) with `surrogateescape`, into text that UTF-8 cannot encode: JSON and CSV files, records, the terminal and a
figure's title would all refuse it. So every file name that reaches an output is `escaped_path(path)`:

- each byte that is not part of valid UTF-8 is written `\\xHH` (two lowercase hex digits): `caf\\xe9.jpg`;
- a backslash is written twice, `\\\\`, so that an escaped name never equals another file's name as written (a
  real `caf\\xe9.jpg`, with a backslash, is written `caf\\\\xe9.jpg`);
- everything else is written as it is.

Nothing changes for the names of most files: UTF-8 without backslashes. `path_from_escaped` undoes the escaping
exactly (the file system's bytes come back); the files themselves are always opened by their real names.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_TO_ESCAPE = re.compile("[\\\\\udc80-\udcff]")  # a backslash, or a byte that surrogateescape kept undecoded
_ESCAPE = re.compile(rb"\\(\\|x[0-9a-f]{2})")


def escaped_path(path: Path | str) -> str:
    """A path (or a bare name) as text that encodes as UTF-8: undecodable bytes as `\\xHH`, `\\` doubled."""
    try:
        data = os.fsencode(path)
    except UnicodeEncodeError:  # a surrogate no file system byte gives (typed text, say): its UTF-8-like bytes
        data = os.fspath(path).encode("utf-8", "surrogatepass")
    return _TO_ESCAPE.sub(_escape, data.decode("utf-8", "surrogateescape"))


def path_from_escaped(text: str) -> Path:
    """The path that `escaped_path` wrote as `text`. A backslash that starts no escape is kept as it is (records
    written before names were escaped)."""
    data = _ESCAPE.sub(_unescape, text.encode("utf-8", "surrogateescape"))
    return Path(os.fsdecode(data))


def _escape(match: re.Match[str]) -> str:
    character = match.group()
    return "\\\\" if character == "\\" else f"\\x{ord(character) - 0xDC00:02x}"


def _unescape(match: re.Match[bytes]) -> bytes:
    escape = match.group(1)
    return b"\\" if escape == b"\\" else bytes([int(escape[1:], 16)])
