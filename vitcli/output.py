"""The one output helper: data to stdout (rich table, JSON or CSV), messages to stderr, files written atomically.

Every result object a command produces implements `Result`; the command hands it here and never prints itself.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from rich.console import Console, RenderableType

from vitcli.errors import VitcliError

FORMATS = ("table", "json", "csv")


class Result(Protocol):
    """What a command computes for one image (or one run): it knows how to become a table, CSV rows and JSON."""

    def table(self) -> RenderableType: ...

    def rows(self) -> list[dict[str, Any]]: ...

    def to_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class OutputOptions:
    format: str = "table"
    quiet: bool = False
    output_dir: Path | None = None
    debug: bool = False


class Output:
    """Routes a command's data and messages; shared by every command through `CommandContext`."""

    def __init__(self, options: OutputOptions):
        self.options = options

    def message(self, text: str) -> None:
        """An informational line on stderr; silenced by --quiet."""
        if not self.options.quiet:
            print(text, file=sys.stderr)

    def warn(self, text: str) -> None:
        """A warning on stderr that --quiet does not silence."""
        print(f"warning: {text}", file=sys.stderr)

    def emit(self, results: Sequence[Result], provenance: dict[str, Any]) -> None:
        """Print the run's data on stdout in the chosen format."""
        fmt = self.options.format
        if fmt == "json":
            sys.stdout.write(to_json_text(run_document(results, provenance)) + "\n")
        elif fmt == "csv":
            sys.stdout.write(csv_text([row for result in results for row in result.rows()]))
        elif not self.options.quiet:
            console = Console(file=sys.stdout)
            for result in results:
                console.print(result.table())

    def directory(self, default: Path) -> Path:
        """The folder for a run's files: --output-dir if given, else `default`; created if missing."""
        return self.make_directory(self.options.output_dir or default)

    def make_directory(self, folder: Path) -> Path:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise VitcliError(f"cannot create output directory {folder}: {error.strerror or error}") from error
        if not os.access(folder, os.W_OK):
            raise VitcliError(f"output directory {folder} is not writable")
        return folder

    def wrote(self, paths: Iterable[Path]) -> None:
        self.message("wrote " + ", ".join(str(path) for path in paths))


def run_document(results: Sequence[Result], provenance: dict[str, Any]) -> dict[str, Any]:
    """The JSON shape of every command's run: provenance once, then one entry per result."""
    return {"provenance": provenance, "results": [result.to_json() for result in results]}


def to_json_text(document: Any) -> str:
    """JSON with full float precision; NaN and infinity become null so every parser accepts the file."""
    return json.dumps(_finite(document), indent=2, ensure_ascii=False)


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
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> Path:
    """Write through a temporary file in the same folder, then rename: readers never see a half-written file."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
        # mkstemp creates 0600 files; give the result the permissions an ordinary open() would.
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def write_text(path: Path, text: str) -> Path:
    return atomic_write(path, lambda stream: stream.write(text.encode("utf-8")))


def write_json(path: Path, document: Any) -> Path:
    return write_text(path, to_json_text(document) + "\n")


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    return write_text(path, csv_text(rows))


def write_figure(path: Path, figure: Any) -> Path:
    """Save a matplotlib figure atomically and release it."""
    import matplotlib.pyplot as plt

    try:
        return atomic_write(path, lambda stream: figure.savefig(stream, format="png", dpi=150, bbox_inches="tight"))
    finally:
        plt.close(figure)
