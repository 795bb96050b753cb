"""A run's record: every result and failure of every process that ran into a run folder, as JSON lines.

    OUTPUT/NAME/records/HOST-pPID-TIME-RANDOM.jsonl      one file per process, appended to by it alone

Each process (a run, a resumed run, a shard on any machine) creates its own file and appends one line per event,
synced before the next result starts, so a result costs one short append however large the run is:

    {"kind": "run", "at", "name", "identity", "shard", "config", "provenance", "result_names", "host", "pid",
     "started"}                                        the invocation, first line of its file
    {"kind": "result", "at", "image", "image_sha256", "subject", "experiment", "command", "settings", "files",
     "compute_seconds", "write_seconds", "summary"}    one published result (`files` relative to the run folder)
    {"kind": "failure", "at", "image", "experiment", "error"}

A kill can leave the last line torn (no newline): readers ignore it and its result is redone. A line that is not
valid JSON or has the wrong shape, nested keys included (vitcli.batch.schema), is reported on stderr and ignored
(what it recorded is redone); a file whose `run` line is unusable is ignored whole, since its results are of an
unknown config. Reading streams every file into dicts keyed by (subject, experiment): the latest line (`at`, seconds
since the epoch) wins.
"""

from __future__ import annotations

import datetime
import json
import os
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitcli.batch.schema import FAILURE, RESULT, RUN, problem
from vitcli.store import HOST, OutputStore

if TYPE_CHECKING:
    from vitcli.runner import Failure, Published

RECORDS = "records"
SHAPES = {"run": RUN, "result": RESULT, "failure": FAILURE}


class RecordWriter:
    """This process's record file: created with its `run` line, then one line per result or failure."""

    def __init__(self, store: OutputStore, run: dict[str, Any]):
        started = datetime.datetime.now(datetime.UTC)
        name = f"{HOST}-p{os.getpid()}-{started:%Y%m%dT%H%M%S}-{secrets.token_hex(3)}.jsonl"
        self.appender = store.appender(store.folder(RECORDS), name)
        self.path = self.appender.path
        self._append("run", {**run, "host": HOST, "pid": os.getpid(), "started": started.isoformat(timespec="seconds")})

    def result(self, published: Published, root: Path) -> None:
        self._append("result", result_entry(published, root))

    def failure(self, failure: Failure) -> None:
        self._append("failure", {"image": failure.subject, "experiment": failure.job, "error": failure.message})

    def close(self) -> None:
        self.appender.close()

    def _append(self, kind: str, data: dict[str, Any]) -> None:
        self.appender.append(json.dumps({"kind": kind, "at": time.time(), **data}, ensure_ascii=False))


def result_entry(published: Published, root: Path) -> dict[str, Any]:
    """One published result as the manifest lists it."""
    image = published.image or {}
    return {
        "image": image.get("path"),
        "image_sha256": image.get("sha256"),
        "subject": published.subject,
        "experiment": published.job.name(),
        "command": published.job.command,
        "settings": published.job.settings(),
        "files": [os.path.relpath(path, root) for path in published.files],
        "compute_seconds": round(published.compute_seconds, 4),
        "write_seconds": round(published.write_seconds, 4),
        "summary": published.summary,
    }


@dataclass
class Record:
    """What the record files of one run folder say, latest line first: invocations, results and failures."""

    runs: list[dict[str, Any]] = field(default_factory=list)  # run lines, oldest first, each with its "file"
    results: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (subject, experiment) -> line
    failures: dict[tuple[str, str | None], dict[str, Any]] = field(default_factory=dict)  # (image, experiment)

    def identities(self) -> set[str]:
        return {run["identity"] for run in self.runs}


def record_files(root: Path) -> list[Path]:
    return sorted((root / RECORDS).glob("*.jsonl"))


def read_record(root: Path, warn: Callable[[str], None], skip_files: Iterable[Path] = ()) -> Record:
    """Every record file of a run folder (but `skip_files`), streamed line by line into one Record."""
    record = Record()
    skipped = set(skip_files)
    for path in record_files(root):
        if path not in skipped:
            _read_file(path, record, warn)
    record.runs.sort(key=lambda run: run["at"])
    return record


def _read_file(path: Path, record: Record, warn: Callable[[str], None]) -> None:
    try:
        stream = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115  (closed below; lines streamed)
    except OSError as error:
        warn(f"cannot read {path} ({error.strerror}); the results it records will be redone")
        return
    with stream:
        for number, line in enumerate(stream, start=1):
            if not line.endswith("\n"):
                return  # the torn last line of a killed process: its result is redone
            try:
                data = json.loads(line)
            except ValueError:
                data, found = None, "is not valid JSON"
            else:
                found = _problem(data, number)
            if found:
                redone = "every result of this file" if number == 1 else "what it recorded"
                warn(f"{path} line {number}{' ' if found.startswith('is ') else ': '}{found}; {redone} will be redone")
                if number == 1:
                    return  # no usable `run` line: the file's results are of an unknown config
                continue
            _add(record, data, path)


def _problem(data: Any, number: int) -> str | None:
    """What is wrong with the line: its kind (a file's first line, and only it, is its `run` line), its time, then
    its whole shape."""
    if not isinstance(data, dict):
        return "must be an object"
    kinds = ["run"] if number == 1 else ["result", "failure"]
    if data.get("kind") not in kinds:
        return f"kind: must be {' or '.join(kinds)}"
    if not isinstance(data.get("at"), (int, float)) or isinstance(data["at"], bool):
        return "at: must be a number (seconds since the epoch)"
    return problem(data, SHAPES[data["kind"]])


def _add(record: Record, data: dict[str, Any], path: Path) -> None:
    kind = data.pop("kind")
    if kind == "run":
        record.runs.append({**data, "file": path})
        return
    key = (data["subject"], data["experiment"]) if kind == "result" else (data["image"], data["experiment"])
    table = record.results if kind == "result" else record.failures
    if key not in table or table[key]["at"] <= data["at"]:
        table[key] = data
