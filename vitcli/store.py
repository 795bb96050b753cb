"""The output store: the only code that touches the output folder. It names, writes and indexes result files.

One result (say `attention-b4-h1-q74`) is a set of files: `.json`, `.csv`, often `.png`. The set is published all
together or not at all:
1. every file is written to a temporary name in the same folder (`.NAME.pPID.RANDOM.tmp`) and flushed to disk;
2. under the folder's lock, with SIGINT/SIGTERM held back, the result's entry is removed from `index.json`, the
   temporary files are renamed over the old ones, files of the old set that the new one lacks are removed, and the
   entry is written back with each file's SHA-256.
A reader trusts only files that `index.json` lists with a matching hash (`is_complete`): a run killed at any point
leaves either the old set indexed or the new one, never a mix that counts. A failed write (full disk, read-only
folder) removes its temporary files and leaves earlier results as they were. Temporary files of processes that no
longer exist (after SIGKILL) are removed the next time their folder is written.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from vitcli import interrupts
from vitcli.errors import UsageError, VitcliError
from vitcli.hashing import file_sha256

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; one writer per folder is then the user's job
    fcntl = None

INDEX = "index.json"
_LOCK = ".index.lock"
Writer = Callable[[BinaryIO], None]
Content = str | bytes | Writer  # text is written as UTF-8; a writer streams its bytes (a figure, say)


class StoreError(VitcliError):
    """Writing into the output folder failed (full disk, read-only folder): every later result would fail the same
    way, so this ends the run instead of counting as one image's failure."""


@dataclass
class ResultFiles:
    """The files of one result, ready to be written: suffix -> a function that writes the bytes."""

    name: str  # the result's stem, e.g. "attention-b4-h1-q74"
    files: dict[str, Content]  # e.g. {"json": text, "csv": text, "png": a writer}
    record: dict[str, Any] = field(default_factory=dict)  # what the index keeps besides the files: command, settings


def check_output_dir(value: Path | str | None, default: Path) -> Path:
    """The output folder from --output-dir, checked before any work. A value that cannot name a folder (empty, a
    file, a path through a file) is a usage error (exit 2); a folder the file system refuses (permissions, read-only)
    is a runtime error (exit 1), like any other file that cannot be written."""
    if value is None:
        return default
    # The raw text: a Path would have turned '' into '.', the working directory.
    text = str(value)
    if not text.strip():
        raise UsageError("--output-dir is empty: give a folder name (default: outputs)")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--output-dir {path} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as error:
        raise UsageError(f"--output-dir {path} cannot be a folder: a part of it is a file") from error
    except OSError as error:
        raise StoreError(f"--output-dir {path} cannot be created: {_reason(error)}") from error
    if not os.access(path, os.W_OK | os.X_OK):
        raise StoreError(f"--output-dir {path} is not writable")
    return path


class OutputStore:
    def __init__(self, root: Path):
        self.root = root

    def folder(self, *parts: str) -> Path:
        """ROOT/part/part, created; every part must already be a safe name (see vitcli.naming)."""
        folder = self.root.joinpath(*parts)
        if any(part in ("", ".", "..") or "/" in part or "\\" in part for part in parts):
            raise VitcliError(f"refusing an output folder outside {self.root}: {'/'.join(parts)}")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StoreError(f"cannot create output folder {folder}: {_reason(error)}") from error
        _remove_orphaned_temporaries(folder)
        return folder

    def write(self, folder: Path, result: ResultFiles) -> list[Path]:
        """Publish one result's files together (see the module docstring); returns the final paths."""
        temporaries: dict[Path, Path] = {}
        try:
            for suffix, content in result.files.items():
                final = folder / f"{result.name}.{suffix}"
                # Known before it exists, so that a signal arriving as the write returns cannot orphan it.
                temporaries[final] = _temporary_name(final)
                _write_temporary(temporaries[final], _writer(content))
            hashes = {final.name: file_sha256(temporary) for final, temporary in temporaries.items()}
            with interrupts.deferred(), _locked(folder):
                index = read_index(folder)
                old = index["results"].pop(result.name, None)
                if old is not None:
                    _write_index(folder, index)
                for final, temporary in temporaries.items():
                    os.replace(temporary, final)
                for stale in set((old or {}).get("files", {})) - set(hashes):
                    (folder / stale).unlink(missing_ok=True)
                index["results"][result.name] = {
                    **result.record,
                    "files": hashes,
                    "written": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                }
                _write_index(folder, index)
        except OSError as error:
            raise StoreError(
                f"cannot write {result.name} in {folder}: {_reason(error)}; earlier results there are untouched"
            ) from error
        finally:
            for temporary in temporaries.values():
                temporary.unlink(missing_ok=True)
        return list(temporaries)

    def is_complete(self, folder: Path, name: str) -> bool:
        """Whether the index lists result `name` and every one of its files is on disk with the listed hash."""
        entry = read_index(folder)["results"].get(name)
        if not entry:
            return False
        return all(
            (folder / file).is_file() and file_sha256(folder / file) == digest
            for file, digest in entry["files"].items()
        )


def read_index(folder: Path) -> dict[str, Any]:
    path = folder / INDEX
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"results": {}}
    except (OSError, ValueError) as error:
        raise VitcliError(f"cannot read {path}: {error}; move it away to start this folder afresh") from error
    if not isinstance(index, dict) or not isinstance(index.get("results"), dict):
        raise VitcliError(f"{path} is not a vitcli index; move it away to start this folder afresh")
    return index


def _write_index(folder: Path, index: dict[str, Any]) -> None:
    text = json.dumps(index, indent=2, ensure_ascii=False, sort_keys=True) + "\n"
    temporary = _temporary_name(folder / INDEX)
    try:
        _write_temporary(temporary, lambda stream: stream.write(text.encode("utf-8")))
        os.replace(temporary, folder / INDEX)
    finally:
        temporary.unlink(missing_ok=True)


def _temporary_name(final: Path) -> Path:
    return final.with_name(f".{final.name}.p{os.getpid()}.{secrets.token_hex(4)}.tmp")


def _writer(content: Content) -> Writer:
    if isinstance(content, str):
        content = content.encode("utf-8")
    if isinstance(content, bytes):
        return lambda stream: stream.write(content)
    return content


def _write_temporary(temporary: Path, writer: Writer) -> None:
    try:
        with open(temporary, "xb") as stream:
            writer(stream)
            stream.flush()
            os.fsync(stream.fileno())
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Serialize index updates of one folder across processes (two commands on the same image at once)."""
    if fcntl is None:
        yield
        return
    with open(folder / _LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _remove_orphaned_temporaries(folder: Path) -> None:
    for temporary in folder.glob(".*.p*.*.tmp"):
        pid_part = temporary.name.rsplit(".", 3)[-3]
        if pid_part.startswith("p") and pid_part[1:].isdigit() and not _alive(int(pid_part[1:])):
            temporary.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reason(error: OSError) -> str:
    """An OSError as words: never a bare errno."""
    names = {
        errno.ENOSPC: "no space left on device",
        errno.EROFS: "read-only file system",
        errno.EACCES: "permission denied",
    }
    return names.get(error.errno) or error.strerror or type(error).__name__
