"""The sections of the report's pages: header, provenance, summary, timings, failures, and the cards of results.

`image_body` renders one image's section from its results' files: the one place a per-image view (the single page's
section, or the image's own page) is drawn. An `explore` result's page is shown in its card, in a sandboxed iframe:
its text inline on the single page, its file by relative path on an image's page. explain's audits are drawn by
audits.py.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from vitcli.batch.manifest import Manifest, plain_cells, timings
from vitcli.naming import MODEL_SUBJECT
from vitcli.output import counted
from vitcli.presentation.explorer_frame import explorer_fragment, explorer_link
from vitcli.render import is_random
from vitcli.report.audits import audit_tables
from vitcli.report.markup import cell, data_table, text
from vitcli.report.reading import CsvExcerpt, ResultView

# The lecture's order; experiments not listed follow by name.
COMMAND_ORDER = (
    "predict", "patches", "attend", "occlude-quadrants", "occlude-patches", "compare-patch-size", "trace", "explain",
    "lens", "explore",
)  # fmt: skip
EXPLORER_HEIGHT = (
    800  # pixels: the explorer's panels and controls at the report's width (about 600 used), room to spare
)
LONG_SUMMARY = 12  # a result's headline numbers beyond this many are folded (explain with audits has dozens)


@dataclass(frozen=True)
class Place:
    """Where a page lies (its folder) and whether it embeds its figures (the single file) or links them by relative
    path (the index and the per-image pages). Only paths inside the run folder reach a page (see reading.inside)."""

    folder: Path
    embed: bool

    def url(self, path: Path) -> str:
        return quote(Path(os.path.relpath(path, self.folder)).as_posix())

    def link(self, path: Path) -> str:
        return text(self.url(path))

    def figure(self, path: Path) -> str:
        if self.embed:
            return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")
        return self.link(path)

    def explorer(self, path: Path, title: str) -> str:
        """The explorer page in a sandboxed iframe: its whole text (the single page) or its file (an image's page,
        which then holds a few hundred bytes instead of the explorer's megabytes)."""
        if self.embed:
            return explorer_fragment(path.read_text(encoding="utf-8"), title, EXPLORER_HEIGHT)
        return explorer_link(self.url(path), title, EXPLORER_HEIGHT)


def weights_label(manifest: Manifest) -> str:
    return str(manifest.provenance.get("weights_label") or manifest.provenance.get("weights") or "unknown weights")


def banner(manifest: Manifest) -> str:
    label = weights_label(manifest)
    random = is_random(label) or (manifest.provenance.get("weights") or {}).get("source") == "random"
    if random:
        return f'<p class="warning">{text(label)} WEIGHTS: untrained model, the numbers mean nothing</p>'
    return f'<p class="meta">weights: {text(label)}</p>'


def header(manifest: Manifest, sources: list[Path], image_count: int) -> str:
    counts = (
        f"{counted(image_count, 'image')}, {counted(len(manifest.results), 'result')}, "
        f"{counted(len(manifest.failures), 'failure')}; model "
        f"{manifest.provenance.get('model', '?')}; from {', '.join(path.name for path in sources)}"
    )
    return f'<header><h1>{text(manifest.name)}</h1>{banner(manifest)}<p class="meta">{text(counts)}</p></header>'


def summary_section(frame: Any, links: dict[str, str | None], interactive: bool, manifest: Manifest) -> str:
    """summary.csv's rows: a static table (the single page) or a sortable, paginated data table (the index); then
    the timings."""
    frame = plain_cells(frame.drop(columns=["image_sha256"]))
    columns = [str(column) for column in frame.columns]
    intro = (
        '<section><h2>Summary</h2><p class="meta">summary.csv: one row per image, headline numbers of each experiment'
    )
    if interactive:
        records = [list(record) for record in frame.itertuples(index=False)]
        images = [record[0] for record in records]
        for record in records:
            record[0] = Path(record[0]).name
        table = data_table("summary-data", columns, records, [links.get(image) for image in images])
        return f"{intro}; click a header to sort, an image for its page</p>{table}{timings_table(manifest)}</section>"
    rows = []
    for record in frame.itertuples(index=False):
        image, *values = record
        link = f'<a href="{text(links[image])}" title="{text(image)}">{text(Path(image).name)}</a>'
        rows.append(f"<tr><td>{link}</td>{''.join(cell(value) for value in values)}</tr>")
    head = "".join(f"<th>{text(column)}</th>" for column in columns)
    table = f'<div class="scroll"><table><tr>{head}</tr>{"".join(rows)}</table></div>'
    return f"{intro}</p>{table}{timings_table(manifest)}</section>"


def timings_table(manifest: Manifest) -> str:
    """Per experiment: how many results and the seconds computing them and writing their files."""
    totals = timings(manifest.results)
    if not totals:
        return ""
    columns = ["results", "compute_seconds", "write_seconds"]
    head = "".join(f"<th>{text(column)}</th>" for column in ["experiment", *columns])
    rows = "".join(
        f"<tr><td>{text(name)}</td>{''.join(cell(total[column]) for column in columns)}</tr>"
        for name, total in totals.items()
    )
    return f"<h3>Timings</h3><table><tr>{head}</tr>{rows}</table>"


def failures_section(failures: list[dict[str, Any]], interactive: bool) -> str:
    if not failures:
        return '<section><h2>Failures</h2><p class="meta">none</p></section>'
    fields = ("image", "experiment", "error")
    if interactive:
        records = [[failure.get(name) for name in fields] for failure in failures]
        table = data_table("failures-data", list(fields), records, [None] * len(records))
        return f"<section><h2>Failures ({len(failures)})</h2>{table}</section>"
    rows = "".join(
        f"<tr><td>{text(failure.get('image'))}</td><td>{text(failure.get('experiment'))}</td>"
        f'<td class="problem">{text(failure.get("error"))}</td></tr>'
        for failure in failures
    )
    head = "".join(f"<th>{name}</th>" for name in fields)
    return f"<section><h2>Failures ({len(failures)})</h2><table><tr>{head}</tr>{rows}</table></section>"


def not_in_this_run_section(images: list[str]) -> str:
    """Images the folder recorded that are not among the run's images (deleted, or left out of a later run)."""
    if not images:
        return ""
    items = "".join(f"<li>{text(image)}</li>" for image in images)
    return (
        f'<section><h2>Not in this run ({len(images)})</h2><p class="meta">recorded in this folder by earlier runs, '
        "not among this run's images: their results stay on disk and `vitcli merge` includes them</p>"
        f"<ul>{items}</ul></section>"
    )


def image_body(image: str, views: list[ResultView], failures: list[dict[str, Any]], place: Place, anchor: str) -> str:
    """One image's section: its name and hash, its failures, then the cards of its results."""
    mine = sorted(views, key=result_order)
    sha256 = mine[0].entry.get("image_sha256") if mine else None
    notes = "".join(
        f'<p class="problem">{text(failure.get("experiment"))} failed: {text(failure.get("error"))}</p>'
        for failure in failures
    )
    folders = sorted({str(Path(file).parent) for view in mine for file in view.entry["files"]})
    meta = f"{image} · SHA-256 {sha256} · folder {', '.join(folders)}"
    heading = f'<h2 id="{anchor}">{text(Path(image).name)}</h2><p class="meta">{text(meta)}</p>{notes}'
    return f"<section>{heading}{cards(mine, place)}</section>"


def subject_section(subject: str, views: list[ResultView], place: Place) -> str:
    title = "The model alone" if subject == MODEL_SUBJECT else f"Subject {subject}"
    return f"<section><h2>{text(title)}</h2>{cards(sorted(views, key=result_order), place)}</section>"


def subject_order(subject: str) -> tuple[bool, str]:
    return subject != MODEL_SUBJECT, subject


def result_order(view: ResultView) -> tuple[int, str]:
    command = view.entry.get("command")
    rank = COMMAND_ORDER.index(command) if command in COMMAND_ORDER else len(COMMAND_ORDER)
    return rank, view.entry["experiment"]


def cards(views: list[ResultView], place: Place) -> str:
    """The lead card shows the crop (the patches figure, else the first figure) with the prediction beside it; every
    other result gets its own card."""
    with_figures = [view for view in views if view.figures]
    lead = next((view for view in with_figures if view.entry.get("command") == "patches"), None)
    lead = lead or (with_figures[0] if with_figures else None)
    predictions = [view for view in views if view.entry.get("command") == "predict" and not view.figures]
    drawn = []
    if lead is not None:
        drawn.append(card(lead.figures, [*predictions, lead], place))
    rest = [view for view in views if view is not lead and not (lead is not None and view in predictions)]
    drawn.extend(card(view.figures, [view], place) for view in rest)
    return "\n".join(drawn)


def card(figures: list[tuple[str, Path]], views: list[ResultView], place: Place) -> str:
    blocks = "".join(numbers(view, place) for view in views)
    explorers = "".join(explorers_block(view, place) for view in views)
    if not figures:
        return f'<div class="card numbers-only"><div>{blocks}</div>{explorers}</div>'
    lazy = "" if place.embed else ' loading="lazy"'
    pictures = "".join(
        f'<figure><a href="{place.link(path)}"><img src="{place.figure(path)}" alt="{text(file)}"{lazy}></a>'
        f"<figcaption>{text(Path(file).name)} (click for the file at full size)</figcaption></figure>"
        for file, path in figures
    )
    return f'<div class="card"><div>{pictures}</div><div>{blocks}</div>{explorers}</div>'


def explorers_block(view: ResultView, place: Place) -> str:
    image = Path(view.entry.get("image") or "").name
    return "".join(
        f'<div class="explorer">{place.explorer(path, f"attention explorer: {image}")}'
        f'<p class="meta">{text(Path(file).name)}: click a patch (or CLS) for its attention in every head; the slider '
        f'chooses the block, the arrow keys move the query; <a href="{place.link(path)}">open it alone</a></p></div>'
        for file, path in view.explorers
    )


def numbers(view: ResultView, place: Place) -> str:
    entry = view.entry
    settings = json.dumps(entry.get("settings", {}), ensure_ascii=False, sort_keys=True)
    spent = "".join(f" · {key.replace('_', ' ')} {value}" for key, value in entry.items() if key.endswith("seconds"))
    parts = [
        f"<h3>{text(entry['experiment'])}</h3>",
        f'<p class="meta">{text(entry.get("command"))} {text(settings)}{text(spent)}</p>',
        *(f'<p class="problem">{text(problem)}</p>' for problem in view.problems),
    ]
    summary = entry.get("summary") or {}
    if summary:
        rows = "".join(f"<tr><th>{text(key)}</th>{cell(value)}</tr>" for key, value in summary.items())
        table = f"<table>{rows}</table>"
        if len(summary) > LONG_SUMMARY:
            table = f"<details><summary>{len(summary)} headline numbers (summary.csv)</summary>{table}</details>"
        parts.append(table)
    parts.append(audit_tables(view.audits))
    if view.excerpt is not None:
        parts.append(excerpt_table(view.excerpt))
    arrays = {file for file, _ in view.arrays}
    links = " ".join(
        f'<a href="{place.link(path)}">{text(Path(file).name)}</a>'
        for file, path in view.paths.items()
        if file not in arrays
    )
    parts.append(f'<p class="meta">files: {links}</p>')
    if view.arrays:
        downloads = " ".join(
            f'<a href="{place.link(path)}" download>{text(Path(file).name)}</a>' for file, path in view.arrays
        )
        parts.append(f'<p class="meta">arrays (NumPy .npy, for numpy.load; not shown here): {downloads}</p>')
    return "".join(parts)


def excerpt_table(table: CsvExcerpt) -> str:
    more = f"; {table.hidden_columns} more columns in the file" if table.hidden_columns else ""
    caption = f"{table.file}: {table.choice} of {table.total_rows}{more}"
    head = "".join(f"<th>{text(column)}</th>" for column in table.columns)
    rows = "".join(f"<tr>{''.join(cell(value) for value in row)}</tr>" for row in table.rows)
    return f'<p class="meta">{text(caption)}</p><div class="scroll"><table><tr>{head}</tr>{rows}</table></div>'


def provenance_section(manifest: Manifest, sources: list[Path]) -> str:
    provenance = manifest.provenance
    versions = ", ".join(f"{name} {version}" for name, version in (provenance.get("versions") or {}).items())
    facts = [
        ("run", manifest.name),
        ("model", provenance.get("model")),
        ("weights", weights_label(manifest)),
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
    rows = "".join(f"<tr><th>{text(name)}</th><td><code>{text(value)}</code></td></tr>" for name, value in facts)
    config = json.dumps(manifest.config, indent=2, ensure_ascii=False)
    return (
        f"<section><h2>Provenance</h2><table>{rows}</table>"
        f"<details><summary>config as run</summary><pre>{text(config)}</pre></details></section>"
    )
