"""A bank of texts for `vitcli heads --texts`: one text per line of a UTF-8 file, read before any model loads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vitcli.errors import UsageError
from vitcli.filenames import escaped_path
from vitcli.hashing import file_sha256


@dataclass(frozen=True)
class TextBank:
    path: Path
    texts: list[str]  # the lines with text, surrounding spaces dropped, each once in the order first met
    sha256: str  # of the file's bytes: the key of the bank's cached embeddings
    lines: int  # lines with text in the file

    @property
    def repeated(self) -> int:
        """How many of the file's lines with text repeat an earlier one."""
        return self.lines - len(self.texts)


def read_text_bank(path: Path, option: str = "--texts") -> TextBank:
    """The bank's texts; refused (exit 2) when the file is missing, not UTF-8 or holds no text."""
    shown = escaped_path(path)
    if not path.is_file():
        raise UsageError(f"{option} {shown}: no such file (give a text file with one text per line)")
    try:
        content = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise UsageError(
            f"{option} {shown} is not UTF-8 text (at byte offset {error.start}): save it as UTF-8"
        ) from error
    except OSError as error:
        raise UsageError(f"{option} {shown}: cannot read it ({error.strerror or error})") from error
    lines = [line.strip() for line in content.splitlines() if line.strip()]
    if not lines:
        raise UsageError(f"{option} {shown} holds no text: write one text per line")
    return TextBank(path, list(dict.fromkeys(lines)), file_sha256(path), len(lines))
