"""What a report reads from a run folder: the manifest(s), and per result its files, never one outside the folder."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitcli.batch.manifest import Manifest, read_manifests
from vitcli.batch.views import merge_manifests
from vitcli.errors import UsageError, VitcliError
from vitcli.output import counted
from vitcli.presentation.explorer_frame import is_explorer_page
from vitcli.store import INDEX, OutputStore

# Columns the publisher adds to every CSV row: the same on every row of a result, so the excerpt leaves them out.
FRAMEWORK_COLUMNS = ("image", "image_sha256", "model", "weights", "result")
MAX_COLUMNS = 10
# Which CSV rows say most for known experiments: (column, largest first). Others show their first rows.
ROW_ORDER = {
    "attend": ("attention", True),
    "occlude-patches": ("drop_points", True),
    "occlude-quadrants": ("drop_points", True),
    "explain": ("rank", False),
}
# Experiments whose JSON `result.audits` the page shows as tables (read only for these: a large run's other JSON files
# stay unread).
AUDITED = ("explain", "bench")  # bench's leaderboard is `audits.leaderboard` of its result over the images


@dataclass
class CsvExcerpt:
    file: str  # the CSV's name
    columns: list[str]
    rows: list[list[str]]
    total_rows: int
    hidden_columns: int
    choice: str  # which rows these are, in words


@dataclass
class ResultView:
    """One manifest entry with what a page shows of its files."""

    entry: dict[str, Any]
    paths: dict[str, Path] = field(default_factory=dict)  # listed file -> its resolved path inside the run folder
    figures: list[tuple[str, Path]] = field(default_factory=list)  # the PNGs among them
    explorers: list[tuple[str, Path]] = field(default_factory=list)  # explore's pages, only of a verified result
    arrays: list[tuple[str, Path]] = field(default_factory=list)  # .npy files: linked for download, never read
    audits: dict[str, Any] = field(default_factory=dict)  # the JSON's result.audits, for AUDITED experiments
    excerpt: CsvExcerpt | None = None
    problems: list[str] = field(default_factory=list)  # refused, missing or changed files, unreadable CSV
    refused: set[str] = field(default_factory=set)  # listed files outside the run folder: never read nor linked


def read_run(run_dir: Path) -> tuple[Manifest, list[Path]]:
    """The run's manifest (shards merged) and the manifest files it came from."""
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is not a folder: give the folder of a `vitcli run` (OUTPUT/RUN_NAME)")
    manifests = read_manifests(run_dir)
    return merge_manifests(manifests, run_dir), [path for path, _ in manifests]


def inside(run_dir: Path, file: str) -> Path | None:
    """The listed file's path if it lies inside the run folder once links and `..` are resolved, else None."""
    root = run_dir.resolve()
    path = (run_dir / file).resolve()
    return path if path.is_relative_to(root) and path != root else None


def read_result(run_dir: Path, entry: dict[str, Any], rows: int) -> ResultView:
    view = ResultView(entry)
    verified = False
    paths = view.paths
    for file in entry["files"]:
        path = inside(run_dir, file)
        if path is None:
            view.refused.add(file)
        else:
            paths[file] = path
    if view.refused:
        view.problems.append("refused, outside the run folder (not read): " + ", ".join(sorted(view.refused)))
    missing = [file for file, path in paths.items() if not path.is_file()]
    if missing:
        view.problems.append("missing: " + ", ".join(missing))
    elif paths and not _indexed(next(iter(paths.values())).parent, entry["experiment"]):
        index = Path(next(iter(paths))).parent / INDEX
        view.problems.append(f"changed since the run: its files differ from the hashes in {index}")
    else:
        verified = not view.refused
    view.figures = [(file, path) for file, path in paths.items() if path.suffix == ".png" and path.is_file()]
    view.arrays = [(file, path) for file, path in paths.items() if path.suffix == ".npy"]
    # An explorer runs its script in the page: only a result whose every file is inside the run folder, present and
    # equal to its hash is embedded.
    pages = [
        (file, path) for file, path in paths.items() if entry.get("command") == "explore" and is_explorer_page(path)
    ]
    if verified:
        view.explorers = pages
    elif pages:
        view.problems.append("its explorer is not embedded: " + ", ".join(sorted(Path(file).name for file, _ in pages)))
    if entry.get("command") in AUDITED:
        view.audits = _audits(paths, entry["experiment"], view.problems)
    tables = [path for path in paths.values() if path.is_file() and path.name.endswith(".csv")]
    main = [path for path in tables if path.name == f"{entry['experiment']}.csv"] or tables
    if main:
        try:
            view.excerpt = excerpt(main[0], entry, rows)
        except (OSError, UnicodeDecodeError, csv.Error) as error:
            view.problems.append(f"cannot read {main[0].name}: {error}")
    return view


def _audits(paths: dict[str, Path], experiment: str, problems: list[str]) -> dict[str, Any]:
    """The `result.audits` object of the result's JSON ({} where it has none)."""
    documents = [path for path in paths.values() if path.name == f"{experiment}.json" and path.is_file()]
    if not documents:
        return {}
    try:
        audits = json.loads(documents[0].read_text(encoding="utf-8")).get("result", {}).get("audits")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as error:
        problems.append(f"cannot read {documents[0].name}: {error}")
        return {}
    return audits if isinstance(audits, dict) else {}


def _indexed(folder: Path, name: str) -> bool:
    try:
        return OutputStore(folder).is_complete(folder, name)
    except VitcliError:
        return False


def excerpt(path: Path, entry: dict[str, Any], limit: int) -> CsvExcerpt:
    """A few rows of a result's CSV: the configured patches for `patches`, the strongest rows for experiments that
    rank something (ROW_ORDER; the ranking column is always among the columns shown), else the first rows."""
    with open(path, newline="", encoding="utf-8") as stream:
        reader = csv.DictReader(stream)
        records = list(reader)
        columns = [column for column in reader.fieldnames or [] if column not in FRAMEWORK_COLUMNS]
    chosen, choice = _choose_rows(entry, records, limit)
    shown = columns[:MAX_COLUMNS]
    ranking = ROW_ORDER.get(entry.get("command"), (None,))[0]
    if ranking in columns and ranking not in shown:
        shown[-1] = ranking
    return CsvExcerpt(
        path.name, shown, [[record.get(column) or "" for column in shown] for record in chosen], len(records),
        len(columns) - len(shown), choice,
    )  # fmt: skip


def _choose_rows(entry: dict[str, Any], records: list[dict[str, str]], limit: int) -> tuple[list, str]:
    command = entry.get("command")
    if command == "patches":
        wanted = {str(patch) for patch in entry.get("settings", {}).get("patch") or []}
        configured = [record for record in records if record.get("patch") in wanted]
        if configured:
            return configured[:limit], "the configured patches"
    if command in ROW_ORDER:
        column, largest_first = ROW_ORDER[command]
        numbers = [(_number(record.get(column)), record) for record in records]
        ranked = [(value, record) for value, record in numbers if value is not None]
        if ranked:
            ranked.sort(key=lambda item: -item[0] if largest_first else item[0])
            order = "largest" if largest_first else "smallest"
            shown = min(limit, len(ranked))
            return [record for _, record in ranked[:limit]], f"the {counted(shown, 'row')} of {order} {column}"
    return records[:limit], f"the first {counted(min(limit, len(records)), 'row')}"


def _number(text: str | None) -> float | None:
    try:
        value = float(text or "")
    except ValueError:
        return None
    return None if math.isnan(value) else value
