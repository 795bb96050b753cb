"""`vitcli report RUN_DIR`: one self-contained HTML page for a batch run (`vitcli run`).

The page reads the run's manifest(s) (manifest.json, or the shards' manifest-shardKofN.json, merged in memory the way
`vitcli merge` merges them) and the files each result lists. PNG figures are embedded as base64 data URIs and the
page loads nothing else (no script, no external font or style sheet), so it can be mailed or archived on its own.
Layout: the run's name with random weights called out, its provenance, the summary table, timings, failures; one
section per image (the crop with the prediction beside it, then every result's figure beside its headline numbers and
a few rows of its CSV), then results about other subjects (the model alone, image sets). Any experiment renders
generically; known ones get a better choice of CSV rows. Every text taken from the run is HTML-escaped.
"""

from __future__ import annotations

import base64
import csv
import datetime
import html
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Any
from urllib.parse import quote

from vitcli.batch.manifest import Manifest, merge, read_manifests, summary_frame, timings
from vitcli.errors import UsageError, VitcliError
from vitcli.naming import MODEL_SUBJECT
from vitcli.render import is_random
from vitcli.store import INDEX, OutputStore, ResultFiles

PAGE_NAME = "report"  # the page is RUN_DIR/report.html
# Columns the publisher adds to every CSV row: the same on every row of a result, so the excerpt leaves them out.
FRAMEWORK_COLUMNS = ("image", "image_sha256", "model", "weights", "result")
MAX_COLUMNS = 10
# The lecture's order; experiments not listed follow by name.
COMMAND_ORDER = (
    "predict", "patches", "attend", "occlude-quadrants", "occlude-patches", "compare-patch-size", "trace", "explain",
    "lens",
)  # fmt: skip
# Which CSV rows say most for known experiments: (column, largest first). Others show their first rows.
ROW_ORDER = {
    "attend": ("attention", True),
    "occlude-patches": ("drop_points", True),
    "occlude-quadrants": ("drop_points", True),
    "explain": ("rank", False),
}
_DECIMAL = re.compile(r"[-+]?(\d+\.\d*|\.\d+)([eE][-+]?\d+)?|[-+]?\d+[eE][-+]?\d+")


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
    """One manifest entry with what the page shows of its files."""

    entry: dict[str, Any]
    figures: list[tuple[str, str]] = field(default_factory=list)  # (file, data URI)
    excerpt: CsvExcerpt | None = None
    problems: list[str] = field(default_factory=list)  # missing or changed files, unreadable CSV


def read_run(run_dir: Path) -> tuple[Manifest, list[Path]]:
    """The run's manifest (shards merged) and the manifest files it came from."""
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is not a folder: give the folder of a `vitcli run` (OUTPUT/RUN_NAME)")
    manifests = read_manifests(run_dir)
    return merge(manifests, run_dir), [path for path, _ in manifests]


def read_result(run_dir: Path, entry: dict[str, Any], rows: int) -> ResultView:
    view = ResultView(entry)
    paths = [run_dir / file for file in entry["files"]]
    missing = [str(file) for file, path in zip(entry["files"], paths, strict=True) if not path.is_file()]
    if missing:
        view.problems.append("missing: " + ", ".join(missing))
    elif paths and not _indexed(paths[0].parent, entry["experiment"]):
        index = Path(entry["files"][0]).parent / INDEX
        view.problems.append(f"changed since the run: its files differ from the hashes in {index}")
    for file, path in zip(entry["files"], paths, strict=True):
        if path.suffix == ".png" and path.is_file():
            view.figures.append((file, "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")))
    tables = [path for path in paths if path.is_file() and path.name.endswith(".csv")]
    main = [path for path in tables if path.name == f"{entry['experiment']}.csv"] or tables
    if main:
        try:
            view.excerpt = excerpt(main[0], entry, rows)
        except (OSError, UnicodeDecodeError, csv.Error) as error:
            view.problems.append(f"cannot read {main[0].name}: {error}")
    return view


def _indexed(folder: Path, name: str) -> bool:
    try:
        return OutputStore(folder).is_complete(folder, name)
    except VitcliError:
        return False


def excerpt(path: Path, entry: dict[str, Any], limit: int) -> CsvExcerpt:
    """A few rows of a result's CSV: the configured patches for `patches`, the strongest rows for experiments that
    rank something (ROW_ORDER), else the first rows."""
    with open(path, newline="", encoding="utf-8") as stream:
        reader = csv.DictReader(stream)
        records = list(reader)
        columns = [column for column in reader.fieldnames or [] if column not in FRAMEWORK_COLUMNS]
    chosen, choice = _choose_rows(entry, records, limit)
    shown = columns[:MAX_COLUMNS]
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
            return [record for _, record in ranked[:limit]], f"the {min(limit, len(ranked))} rows of {order} {column}"
    return records[:limit], f"the first {min(limit, len(records))} rows"


def _number(text: str | None) -> float | None:
    try:
        value = float(text or "")
    except ValueError:
        return None
    return None if math.isnan(value) else value


# ----- the page


def build_page(run_dir: Path, rows: int = 5) -> str:
    manifest, sources = read_run(run_dir)
    views = [read_result(run_dir, entry, rows) for entry in manifest.results]
    images = sorted({view.entry["image"] for view in views if view.entry.get("image")})
    anchors = {image: f"image-{number}" for number, image in enumerate(images, start=1)}
    others = sorted({view.entry["subject"] for view in views if not view.entry.get("image")}, key=_subject_order)
    body = [
        _header(manifest, sources, len(images)),
        _provenance_section(manifest, sources),
        _summary_section(manifest, anchors),
        _failures_section(manifest.failures),
        *(_image_section(image, anchors[image], views, manifest.failures) for image in images),
        *(
            _subject_section(subject, [view for view in views if view.entry["subject"] == subject])
            for subject in others
        ),
    ]
    return PAGE.substitute(title=_text(f"vitcli report: {manifest.name}"), style=STYLE, body="\n".join(body))


def write_report(run_dir: Path, rows: int = 5) -> Path:
    """Build the page and publish it as RUN_DIR/report.html through the output store."""
    (path,) = OutputStore(run_dir).write(run_dir, ResultFiles(PAGE_NAME, {"html": build_page(run_dir, rows)}))
    return path


def _subject_order(subject: str) -> tuple[bool, str]:
    return subject != MODEL_SUBJECT, subject


def _weights_label(manifest: Manifest) -> str:
    return str(manifest.provenance.get("weights_label") or manifest.provenance.get("weights") or "unknown weights")


def _header(manifest: Manifest, sources: list[Path], image_count: int) -> str:
    label = _weights_label(manifest)
    random = is_random(label) or (manifest.provenance.get("weights") or {}).get("source") == "random"
    banner = (
        f'<p class="warning">{_text(label)} WEIGHTS: untrained model, the numbers mean nothing</p>'
        if random
        else f'<p class="meta">weights: {_text(label)}</p>'
    )
    counts = (
        f"{image_count} images, {len(manifest.results)} results, {len(manifest.failures)} failures; model "
        f"{manifest.provenance.get('model', '?')}; from {', '.join(path.name for path in sources)}"
    )
    return f'<header><h1>{_text(manifest.name)}</h1>{banner}<p class="meta">{_text(counts)}</p></header>'


def _summary_section(manifest: Manifest, anchors: dict[str, str]) -> str:
    frame = summary_frame(manifest.results).drop(columns=["image_sha256"])
    columns = [str(column) for column in frame.columns]
    rows = []
    for record in frame.itertuples(index=False):
        image, *values = record
        link = f'<a href="#{anchors[image]}" title="{_text(image)}">{_text(Path(image).name)}</a>'
        rows.append(f"<tr><td>{link}</td>{''.join(_cell(value) for value in values)}</tr>")
    head = "".join(f"<th>{_text(column)}</th>" for column in columns)
    return (
        '<section><h2>Summary</h2><p class="meta">summary.csv: one row per image, headline numbers of each '
        "experiment</p>"
        f'<div class="scroll"><table><tr>{head}</tr>{"".join(rows)}</table></div>{_timings_table(manifest)}</section>'
    )


def _timings_table(manifest: Manifest) -> str:
    """Per experiment: how many results and the seconds computing them and writing their files."""
    totals = timings(manifest.results)
    if not totals:
        return ""
    columns = ["results", "compute_seconds", "write_seconds"]
    head = "".join(f"<th>{_text(column)}</th>" for column in ["experiment", *columns])
    rows = "".join(
        f"<tr><td>{_text(name)}</td>{''.join(_cell(total[column]) for column in columns)}</tr>"
        for name, total in totals.items()
    )
    return f"<h3>Timings</h3><table><tr>{head}</tr>{rows}</table>"


def _failures_section(failures: list[dict[str, Any]]) -> str:
    if not failures:
        return '<section><h2>Failures</h2><p class="meta">none</p></section>'
    rows = "".join(
        f"<tr><td>{_text(failure.get('image'))}</td><td>{_text(failure.get('experiment'))}</td>"
        f'<td class="problem">{_text(failure.get("error"))}</td></tr>'
        for failure in failures
    )
    return (
        f"<section><h2>Failures ({len(failures)})</h2><table><tr><th>image</th><th>experiment</th><th>error</th></tr>"
        f"{rows}</table></section>"
    )


def _image_section(image: str, anchor: str, views: list[ResultView], failures: list[dict[str, Any]]) -> str:
    mine = sorted((view for view in views if view.entry.get("image") == image), key=_result_order)
    sha256 = mine[0].entry.get("image_sha256") if mine else None
    failed = [failure for failure in failures if failure.get("image") == image]
    notes = "".join(
        f'<p class="problem">{_text(failure.get("experiment"))} failed: {_text(failure.get("error"))}</p>'
        for failure in failed
    )
    folders = sorted({str(Path(file).parent) for view in mine for file in view.entry["files"]})
    meta = f"{image} · SHA-256 {sha256} · folder {', '.join(folders)}"
    heading = f'<h2 id="{anchor}">{_text(Path(image).name)}</h2><p class="meta">{_text(meta)}</p>{notes}'
    return f"<section>{heading}{_cards(mine)}</section>"


def _subject_section(subject: str, views: list[ResultView]) -> str:
    title = "The model alone" if subject == MODEL_SUBJECT else f"Subject {subject}"
    return f"<section><h2>{_text(title)}</h2>{_cards(sorted(views, key=_result_order))}</section>"


def _result_order(view: ResultView) -> tuple[int, str]:
    command = view.entry.get("command")
    rank = COMMAND_ORDER.index(command) if command in COMMAND_ORDER else len(COMMAND_ORDER)
    return rank, view.entry["experiment"]


def _cards(views: list[ResultView]) -> str:
    """The lead card shows the crop (the patches figure, else the first figure) with the prediction beside it; every
    other result gets its own card."""
    with_figures = [view for view in views if view.figures]
    lead = next((view for view in with_figures if view.entry.get("command") == "patches"), None)
    lead = lead or (with_figures[0] if with_figures else None)
    predictions = [view for view in views if view.entry.get("command") == "predict" and not view.figures]
    cards = []
    if lead is not None:
        cards.append(_card(lead.figures, [*predictions, lead]))
    rest = [view for view in views if view is not lead and not (lead is not None and view in predictions)]
    cards.extend(_card(view.figures, [view]) for view in rest)
    return "\n".join(cards)


def _card(figures: list[tuple[str, str]], views: list[ResultView]) -> str:
    blocks = "".join(_numbers(view) for view in views)
    if not figures:
        return f'<div class="card numbers-only"><div>{blocks}</div></div>'
    pictures = "".join(
        f'<figure><a href="{_text(quote(file))}"><img src="{uri}" alt="{_text(file)}"></a>'
        f"<figcaption>{_text(Path(file).name)} (click for the file at full size)</figcaption></figure>"
        for file, uri in figures
    )
    return f'<div class="card"><div>{pictures}</div><div>{blocks}</div></div>'


def _numbers(view: ResultView) -> str:
    entry = view.entry
    settings = json.dumps(entry.get("settings", {}), ensure_ascii=False, sort_keys=True)
    spent = "".join(f" · {key.replace('_', ' ')} {value}" for key, value in entry.items() if key.endswith("seconds"))
    parts = [
        f"<h3>{_text(entry['experiment'])}</h3>",
        f'<p class="meta">{_text(entry.get("command"))} {_text(settings)}{_text(spent)}</p>',
        *(f'<p class="problem">{_text(problem)}</p>' for problem in view.problems),
    ]
    summary = entry.get("summary") or {}
    if summary:
        rows = "".join(f"<tr><th>{_text(key)}</th>{_cell(value)}</tr>" for key, value in summary.items())
        parts.append(f"<table>{rows}</table>")
    if view.excerpt is not None:
        parts.append(_excerpt_table(view.excerpt))
    links = " ".join(f'<a href="{_text(quote(file))}">{_text(Path(file).name)}</a>' for file in entry["files"])
    parts.append(f'<p class="meta">files: {links}</p>')
    return "".join(parts)


def _excerpt_table(table: CsvExcerpt) -> str:
    more = f"; {table.hidden_columns} more columns in the file" if table.hidden_columns else ""
    caption = f"{table.file}: {table.choice} of {table.total_rows}{more}"
    head = "".join(f"<th>{_text(column)}</th>" for column in table.columns)
    rows = "".join(f"<tr>{''.join(_cell(value) for value in row)}</tr>" for row in table.rows)
    return f'<p class="meta">{_text(caption)}</p><div class="scroll"><table><tr>{head}</tr>{rows}</table></div>'


def _provenance_section(manifest: Manifest, sources: list[Path]) -> str:
    provenance = manifest.provenance
    versions = ", ".join(f"{name} {version}" for name, version in (provenance.get("versions") or {}).items())
    facts = [
        ("run", manifest.name),
        ("model", provenance.get("model")),
        ("weights", _weights_label(manifest)),
        ("weights source", json.dumps(provenance.get("weights"), ensure_ascii=False)),
        ("parameters SHA-256", provenance.get("parameters_sha256")),
        ("device", provenance.get("device")),
        ("preprocessing", json.dumps(provenance.get("preprocessing"), ensure_ascii=False)),
        ("versions", versions),
        ("command", provenance.get("command")),
        ("config", manifest.config.get("path")),
        ("identity", manifest.identity),
        ("manifests", ", ".join(path.name for path in sources)),
        ("page written", datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")),
    ]
    rows = "".join(f"<tr><th>{_text(name)}</th><td><code>{_text(value)}</code></td></tr>" for name, value in facts)
    config = json.dumps(manifest.config, indent=2, ensure_ascii=False)
    return (
        f"<section><h2>Provenance</h2><table>{rows}</table>"
        f"<details><summary>config as run</summary><pre>{_text(config)}</pre></details></section>"
    )


def _text(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _cell(value: Any) -> str:
    """A table cell: numbers right-aligned to 4 significant digits (the full value on hover), all else escaped."""
    if isinstance(value, bool) or value is None:
        return f"<td>{_text(value)}</td>"
    if isinstance(value, float) and math.isnan(value):
        return "<td></td>"
    if isinstance(value, int):
        return f'<td class="number">{value}</td>'
    if isinstance(value, float) or (isinstance(value, str) and _DECIMAL.fullmatch(value)):
        return f'<td class="number" title="{_text(value)}">{float(value):.4g}</td>'
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return f'<td class="number">{_text(value)}</td>'
    return f"<td>{_text(value)}</td>"


PAGE = Template("""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>$title</title>
<style>$style</style>
</head>
<body>
$body
</body>
</html>
""")

STYLE = """
body { font: 14px/1.45 system-ui, "Segoe UI", Helvetica, Arial, sans-serif; color: #1d232a; background: #fff;
       max-width: 1240px; margin: 0 auto; padding: 12px 24px 48px; }
h1 { font-size: 26px; margin: 8px 0 6px; }
h2 { font-size: 19px; margin: 0 0 4px; padding-bottom: 2px; border-bottom: 2px solid #2f5d8a; }
h3 { font-size: 15px; margin: 14px 0 2px; }
h3:first-child { margin-top: 0; }
section { margin: 30px 0; }
a { color: #2f5d8a; }
.warning { background: #b00020; color: #fff; font-weight: bold; padding: 8px 12px; border-radius: 4px; }
.problem { color: #b00020; overflow-wrap: anywhere; }
.meta { color: #5a6570; font-size: 12px; margin: 0 0 6px; overflow-wrap: anywhere; }
.card { display: grid; grid-template-columns: minmax(0, 3fr) minmax(0, 2fr); gap: 20px; align-items: start;
        border: 1px solid #d7dde3; border-radius: 6px; padding: 12px; margin: 12px 0; }
.card.numbers-only { grid-template-columns: minmax(0, 1fr); }
figure { margin: 0 0 10px; }
table + .meta, .scroll + .meta { margin-top: 6px; }
img { display: block; max-width: 100%; height: auto; }
figcaption { color: #5a6570; font-size: 12px; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 12px; margin: 4px 0 10px; }
th, td { border: 1px solid #d7dde3; padding: 2px 6px; text-align: left; vertical-align: top; }
th { background: #eef2f6; font-weight: 600; }
td.number { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
code, pre { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; overflow-wrap: anywhere; }
pre { background: #f5f7f9; padding: 8px; overflow-x: auto; }
"""
