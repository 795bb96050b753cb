"""The one output helper for streams: data on stdout (table, JSON, JSON lines, CSV), messages on stderr.

Results are printed as each one finishes (`jsonl` lines are flushed at once, so `jq` or a pipe sees them
immediately); `json` prints one document at the end. File writing is the output store's job (vitcli.store), and the
same document and rows go to files and to stdout (`file_document`, `csv_rows`).
"""

from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
import re
import shutil
import sys
from collections.abc import Sequence
from typing import Any

from vitcli.render import fitted

FORMATS = ("table", "json", "jsonl", "csv")
WIDE_PIPE_COLUMNS = 200  # tables sent to a file or pipe are not cut at rich's default 80 columns


def counted(count: int, noun: str) -> str:
    """`1 failure`, `2 failures`: a count with its noun in the right number."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


class Messages:
    """Informational lines (silenced by --quiet), warnings and errors, all on stderr."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet

    def info(self, text: str) -> None:
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)

    def warn(self, text: str) -> None:
        print(f"warning: {text}", file=sys.stderr, flush=True)

    def error(self, text: str) -> None:
        print(f"error: {text}", file=sys.stderr, flush=True)


class Emitter:
    """Prints each result on stdout in the chosen format as soon as it is ready."""

    def __init__(self, format: str = "table", quiet: bool = False):
        self.format = format
        self.quiet = quiet
        self._documents: list[dict[str, Any]] = []
        self._failures: list[dict[str, str]] = []
        self._csv_columns: list[str] | None = None
        self.tidy_csv = False  # one stream of several experiments: CSV rows are (image, ..., key, value)
        self.show_tables = True  # a batch run prints one summary table at the end instead of every result's
        self._console = None

    def result(self, document: dict[str, Any], table: Any, rows: Sequence[dict[str, Any]]) -> None:
        """Print one result: `rows` are its CSV rows; with `tidy_csv` (mixed experiments in one stream, as in
        `vitcli run`) they are already (image, model, result, key, value) rows."""
        if self.format == "json":
            self._documents.append(document)
        elif self.format == "jsonl":
            _write_line(json_text(document, indent=None))
        elif self.format == "csv":
            self._csv(rows)
        elif self.show_tables and not self.quiet:
            self.console().print(fitted(table))
            sys.stdout.flush()

    def table(self, table: Any) -> None:
        """A closing table (a batch run's summary) in table format."""
        if self.format == "table" and not self.quiet:
            self.console().print(fitted(table))

    def failure(self, subject: str, message: str) -> None:
        """A failed image: in JSON documents too, so scripts see it, not only people reading stderr."""
        record = {"subject": subject, "error": message}
        if self.format == "json":
            self._failures.append(record)
        elif self.format == "jsonl":
            _write_line(json_text(record, indent=None))

    def finish(self) -> None:
        if self.format == "json":
            document: dict[str, Any] = {"results": self._documents}
            if self._failures:
                document["failures"] = self._failures
            _write_line(json_text(document))

    def console(self) -> Any:
        if self._console is None:
            self._console = _stdout_console(None if sys.stdout.isatty() else _pipe_width())
        return self._console

    def _csv(self, rows: Sequence[dict[str, Any]]) -> None:
        if not rows:
            return
        header = self._csv_columns is None
        if header:
            self._csv_columns = list(rows[0])
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=self._csv_columns, lineterminator="\n", extrasaction="ignore")
        if header:
            writer.writeheader()
        writer.writerows(rows)
        _write_line(buffer.getvalue().rstrip("\n"))


def _stdout_console(width: int | None) -> Any:
    """A rich console on stdout. When the reader of a pipe has gone, rich would exit with 1; this one raises
    BrokenPipeError, which the commands turn into exit 141 as for every other format (vitcli.shell)."""
    from rich.console import Console

    class StdoutConsole(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError(errno.EPIPE, "stdout is a closed pipe")

    return StdoutConsole(file=sys.stdout, width=width, soft_wrap=False)


def _pipe_width() -> int:
    """The terminal's width when one is attached to stderr or set in COLUMNS, else wide enough for every table."""
    if re.fullmatch(r"[0-9]+", os.environ.get("COLUMNS", "")):
        return int(os.environ["COLUMNS"])
    for stream in (sys.stderr, sys.stdin):
        try:
            if stream is not None and stream.isatty():
                return shutil.get_terminal_size().columns
        except (OSError, ValueError):
            continue
    return WIDE_PIPE_COLUMNS


def _write_line(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def json_text(document: Any, indent: int | None = 2) -> str:
    """JSON with full float precision; NaN and infinity become null so every parser accepts it."""
    return json.dumps(_finite(document), indent=indent, ensure_ascii=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def csv_text(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return ""
    buffer = io.StringIO()
    columns = list(dict.fromkeys(key for row in rows for key in row))
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()
