"""The output store: the only code that touches the output folder. It names, writes and indexes result files.

One result (say `attention-b4-h1-q74`) is a set of files: `.json`, `.csv`, often `.png`. The set is published all
together or not at all:
1. every file is written to a temporary name in the same folder (`.NAME.HOST.pPID.RANDOM.tmp`) and flushed to
   disk; presentation and figures are drawn here, and a signal interrupts them at once;
2. under the folder's lock, with SIGINT/SIGTERM held back, the result's entry is removed from `index.json`, the
   temporary files are renamed over the old ones, files of the old set that the new one lacks are removed, the
   entry is written back with each file's SHA-256, and the caller's `then` (a batch run's record line) runs.
A reader trusts only files that `index.json` lists with a matching hash (`is_complete`): a run killed at any point
leaves either the old set indexed or the new one, never a mix that counts. A failed write (full disk, read-only
folder) removes its temporary files and leaves earlier results as they were. Temporary files of processes that no
longer exist (after SIGKILL) are removed the next time their folder is written, but only those of this host: HOST
names the machine and its process namespace, so shards on many machines sharing one folder never remove each
other's files. Nothing is written through a symbolic link planted inside the store's root.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import hashlib
import json
import os
import re
import secrets
import socket
import sys
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
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_WARNED: set[tuple[str, str]] = set()  # index entries of the wrong shape already reported
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
            self.root.mkdir(parents=True, exist_ok=True)
            for depth in range(1, len(parts) + 1):
                inside = self.root.joinpath(*parts[:depth])
                _refuse_link(inside, self.root)
                inside.mkdir(exist_ok=True)
        except FileNotFoundError as error:
            raise StoreError(f"cannot create output folder {folder}: {self.root} no longer exists") from error
        except OSError as error:
            raise StoreError(f"cannot create output folder {folder}: {_reason(error)}") from error
        _remove_orphaned_temporaries(folder)
        return folder

    def write(self, folder: Path, result: ResultFiles, then: Callable[[list[Path]], None] | None = None) -> list[Path]:
        """Publish one result's files together (see the module docstring); returns the final paths. `then(paths)`
        runs with them in place and indexed, before a held-back signal is raised."""
        temporaries: dict[Path, Path] = {}
        try:
            for suffix, content in result.files.items():
                final = folder / f"{result.name}.{suffix}"
                # Known before it exists, so that a signal arriving as the write returns cannot orphan it.
                temporaries[final] = _temporary_name(final)
                _write_temporary(temporaries[final], _writer(content))
            hashes = {final.name: file_sha256(temporary) for final, temporary in temporaries.items()}
            with interrupts.deferred(), _locked(folder, self.root):
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
                if then is not None:
                    then(list(temporaries))
        except OSError as error:
            raise StoreError(
                f"cannot write {result.name} in {folder}: {_reason(error)}; earlier results there are untouched"
            ) from error
        finally:
            for temporary in temporaries.values():
                with contextlib.suppress(OSError):  # a read-only or vanished folder: the error above says why
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

    @contextlib.contextmanager
    def exclusive(self, name: str) -> Iterator[None]:
        """Hold lock file ROOT/name: processes that build views of shared files take turns (the last to read
        writes last). Works across machines where the file system supports locks (NFS does, through the server)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StoreError(f"cannot create output folder {self.root}: {_reason(error)}") from error
        with _locked(self.root, self.root, name):
            yield

    def remove(self, path: Path) -> None:
        """Remove one file inside the store's root (a superseded record, say)."""
        if not Path(os.path.abspath(path)).is_relative_to(os.path.abspath(self.root)):
            raise VitcliError(f"refusing to remove {path}: it is outside {self.root}")
        try:
            Path(path).unlink(missing_ok=True)
        except OSError as error:
            raise StoreError(f"cannot remove {path}: {_reason(error)}") from error

    def appender(self, folder: Path, name: str) -> LineAppender:
        """A new file `folder/name` that only this process appends lines to (a batch run's record)."""
        path = folder / name
        _refuse_link(folder, self.root)
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | _NOFOLLOW, 0o644)
        except OSError as error:
            raise StoreError(f"cannot create {path}: {_reason(error)}") from error
        return LineAppender(path, descriptor)


class LineAppender:
    """Appends whole lines to one file, each synced before `append` returns: after a kill the file ends with every
    line appended before it, and at most one torn last line (without its newline) that readers ignore."""

    def __init__(self, path: Path, descriptor: int):
        self.path = path
        self.descriptor = descriptor

    def append(self, line: str) -> None:
        data = (line + "\n").encode("utf-8")
        try:
            if os.fstat(self.descriptor).st_nlink == 0:
                raise StoreError(f"{self.path} was removed while this run was writing it (was the folder deleted?)")
            written = 0
            while written < len(data):
                written += os.write(self.descriptor, data[written:])
            os.fsync(self.descriptor)
        except OSError as error:
            raise StoreError(f"cannot append to {self.path}: {_reason(error)}") from error

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.descriptor)


def read_index(folder: Path) -> dict[str, Any]:
    """A folder's index; an entry of the wrong shape is dropped with a warning (its result counts as not written)."""
    path = folder / INDEX
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"results": {}}
    except (OSError, ValueError) as error:
        raise VitcliError(
            f"cannot read {path}: {_reason_any(error)}; move it away to start this folder afresh"
        ) from error
    if not isinstance(index, dict) or not isinstance(index.get("results"), dict):
        raise VitcliError(f"{path}: key `results` must be an object of result entries; move the file away")
    for name, entry in list(index["results"].items()):
        problem = _entry_problem(entry)
        if problem:
            if (str(path), name) not in _WARNED:  # once per process: the index is read before and at each write
                _WARNED.add((str(path), name))
                print(f"warning: {path}: results.{name}{problem}; that result will be redone", file=sys.stderr)
            del index["results"][name]
    return index


def _entry_problem(entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return " must be an object"
    files = entry.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in files.items()
    ):
        return ".files must be an object of file name -> SHA-256"
    if any(Path(name).name != name or name in (".", "..") for name in files):
        return ".files names a file outside its folder"
    return None


def _write_index(folder: Path, index: dict[str, Any]) -> None:
    text = json.dumps(index, indent=2, ensure_ascii=False, sort_keys=True) + "\n"
    temporary = _temporary_name(folder / INDEX)
    try:
        _write_temporary(temporary, lambda stream: stream.write(text.encode("utf-8")))
        os.replace(temporary, folder / INDEX)
    finally:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)


def _host_tag() -> str:
    """This machine and process namespace as a file-name part: the host name, then a hash of the boot id and the PID
    namespace, so two containers (or two PID namespaces) on one machine are two hosts too."""
    name = re.sub(r"[^A-Za-z0-9-]+", "-", socket.gethostname()).strip("-")[:32] or "host"
    where = []
    for source in ("/proc/sys/kernel/random/boot_id", "/proc/self/ns/pid"):
        with contextlib.suppress(OSError):
            where.append(Path(source).read_text() if source.endswith("boot_id") else os.readlink(source))
    return f"{name}-{hashlib.sha256(chr(0).join(where).encode()).hexdigest()[:6]}"


HOST = _host_tag()
_TEMPORARY = re.compile(r"^\..+\.(?P<host>[A-Za-z0-9-]+)\.p(?P<pid>[0-9]+)\.[0-9a-f]+\.tmp$")


def _temporary_name(final: Path) -> Path:
    return final.with_name(f".{final.name}.{HOST}.p{os.getpid()}.{secrets.token_hex(4)}.tmp")


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
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def _locked(folder: Path, root: Path, name: str = _LOCK) -> Iterator[None]:
    """Serialize index updates of one folder across processes (two commands on the same image at once)."""
    if fcntl is None:
        yield
        return
    path = folder / name
    _refuse_link(path, root)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | _NOFOLLOW, 0o644)
    except OSError as error:
        raise StoreError(f"cannot write in {folder}: {_reason(error)}") from error
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing releases the lock


def _refuse_link(path: Path, root: Path) -> None:
    """Nothing is written through a symbolic link inside the store's root: it could point anywhere."""
    if path != root and path.is_symlink():
        raise StoreError(f"refusing to write through {path}: it is a symbolic link inside {root}; remove it")


def _remove_orphaned_temporaries(folder: Path) -> None:
    """Temporaries this host's dead processes left (after SIGKILL); another host's are never touched, whatever their
    process id says here. Best effort: a folder that refuses is reported by the write that follows."""
    try:
        for temporary in folder.glob(".*.tmp"):
            match = _TEMPORARY.match(temporary.name)
            if match and match["host"] == HOST and not _alive(int(match["pid"])):
                temporary.unlink(missing_ok=True)
    except OSError:
        return


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
        errno.ENOENT: "no such file or folder (was it removed during the run?)",
        errno.ELOOP: "a symbolic link is in the way",
    }
    return names.get(error.errno) or error.strerror or type(error).__name__


def _reason_any(error: Exception) -> str:
    return _reason(error) if isinstance(error, OSError) else str(error)
