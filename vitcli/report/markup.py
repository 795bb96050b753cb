"""HTML pieces shared by the report's pages: escaping, table cells, the page frame, its style sheet, and the sortable
paginated table the index draws from JSON embedded in the page (inline script; nothing is fetched)."""

from __future__ import annotations

import html
import json
import math
import re
from string import Template
from typing import Any

from vitcli.presentation.explore_page import SCRIPT_SOURCE as EXPLORER_SCRIPT
from vitcli.presentation.explore_page import script_source

_DECIMAL = re.compile(r"[-+]?(\d+\.\d*|\.\d+)([eE][-+]?\d+)?|[-+]?\d+[eE][-+]?\d+")
TABLE_PAGE_ROWS = 100  # rows per page of a data table


def text(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def cell(value: Any) -> str:
    """A table cell: numbers right-aligned to 4 significant digits (the full value on hover), all else escaped."""
    if isinstance(value, bool) or value is None:
        return f"<td>{text(value)}</td>"
    if isinstance(value, float) and math.isnan(value):
        return "<td></td>"
    if isinstance(value, int):
        return f'<td class="number">{value}</td>'
    if isinstance(value, float) or (isinstance(value, str) and _DECIMAL.fullmatch(value)):
        return f'<td class="number" title="{text(value)}">{float(value):.4g}</td>'
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return f'<td class="number">{text(value)}</td>'
    return f"<td>{text(value)}</td>"


def json_value(value: Any) -> Any:
    """A value for a data table's JSON: numbers as numbers (6 significant digits: the page shows 4, the CSV keeps
    all), NaN and None as null, anything else as text."""
    if value is None or isinstance(value, bool):
        return value
    if hasattr(value, "item"):  # numpy scalars from pandas
        value = value.item()
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else float(f"{value:.6g}")
    return str(value)


def data_table(identifier: str, columns: list[str], rows: list[list[Any]], links: list[str | None]) -> str:
    """A table drawn by SCRIPT: sortable by any column (click its header), filtered by text, TABLE_PAGE_ROWS rows a
    page. `links[i]` is the page row i's first cell links to. The JSON is escaped so no text can close the script."""
    data = {"columns": columns, "rows": [[json_value(value) for value in row] for row in rows], "links": links}
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    payload = payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    payload = payload.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")  # line ends to a script parser
    return (
        f'<div class="datatable" data-source="{text(identifier)}" data-page-rows="{TABLE_PAGE_ROWS}"></div>'
        f'<script type="application/json" id="{text(identifier)}">{payload}</script>'
    )


def page(title: str, body: str, script: bool) -> str:
    return PAGE.substitute(
        title=text(title),
        policy=POLICY,
        style=STYLE,
        body=body,
        script=f"<script>{SCRIPT}</script>" if script else "",
    )


PAGE = Template(
    """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
"""
    + '<meta http-equiv="Content-Security-Policy" content="$policy">'
    + """
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>$title</title>
<style>$style</style>
</head>
<body>
$body
$script
</body>
</html>
"""
)

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
.card > .explorer { grid-column: 1 / -1; }
td.fail { color: #b00020; font-weight: bold; }
details > summary { cursor: pointer; color: #2f5d8a; font-size: 12px; }
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
.datatable th { cursor: pointer; user-select: none; }
.datatable th[aria-sort="ascending"]::after { content: " \\25B2"; }
.datatable th[aria-sort="descending"]::after { content: " \\25BC"; }
.controls { display: flex; gap: 10px; align-items: center; font-size: 12px; margin: 6px 0; }
.controls input { font: inherit; padding: 2px 6px; min-width: 16em; }
"""

# Draws every div.datatable from its JSON: text only through textContent, so nothing in the data becomes markup.
SCRIPT = """
(function () {
  "use strict";
  function empty(value) { return value === null || value === undefined || value === ""; }
  function format(value) {
    if (empty(value)) { return ""; }
    if (typeof value === "number") { return Number.isInteger(value) ? String(value) : String(+value.toPrecision(4)); }
    return String(value);
  }
  function compare(a, b) {
    if (typeof a === "number" && typeof b === "number") { return a - b; }
    return String(a).localeCompare(String(b), undefined, {numeric: true});
  }
  function button(label, action) {
    var element = document.createElement("button");
    element.type = "button";
    element.textContent = label;
    element.addEventListener("click", action);
    return element;
  }
  function draw(holder) {
    var data = JSON.parse(document.getElementById(holder.dataset.source).textContent);
    var pageRows = parseInt(holder.dataset.pageRows, 10);
    var shown = data.rows.map(function (row, index) { return index; });
    var state = {page: 0, column: -1, descending: false};
    var filter = document.createElement("input");
    filter.type = "search";
    filter.placeholder = "filter rows (any cell)";
    var where = document.createElement("span");
    var previous = button("previous", function () { state.page -= 1; render(); });
    var next = button("next", function () { state.page += 1; render(); });
    var controls = document.createElement("div");
    controls.className = "controls";
    [filter, previous, where, next].forEach(function (element) { controls.appendChild(element); });
    var table = document.createElement("table");
    var head = table.createTHead().insertRow();
    var body = table.createTBody();
    data.columns.forEach(function (name, column) {
      var th = document.createElement("th");
      th.textContent = name;
      th.title = "sort by " + name;
      th.addEventListener("click", function () {
        state.descending = state.column === column ? !state.descending : false;
        state.column = column;
        state.page = 0;
        head.querySelectorAll("th").forEach(function (other) { other.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", state.descending ? "descending" : "ascending");
        order();
        render();
      });
      head.appendChild(th);
    });
    function order() {
      var column = state.column, sign = state.descending ? -1 : 1;
      if (column < 0) { return; }
      shown.sort(function (i, j) {
        var a = data.rows[i][column], b = data.rows[j][column];
        if (empty(a) || empty(b)) { return empty(a) === empty(b) ? i - j : (empty(a) ? 1 : -1); }
        return sign * compare(a, b) || i - j;
      });
    }
    filter.addEventListener("input", function () {
      var wanted = filter.value.toLowerCase();
      shown = data.rows.map(function (row, index) { return index; }).filter(function (index) {
        return !wanted || data.rows[index].some(function (value) {
          return format(value).toLowerCase().indexOf(wanted) >= 0 || String(value).toLowerCase().indexOf(wanted) >= 0;
        });
      });
      state.page = 0;
      order();
      render();
    });
    function render() {
      var pages = Math.max(1, Math.ceil(shown.length / pageRows));
      state.page = Math.min(Math.max(state.page, 0), pages - 1);
      body.textContent = "";
      shown.slice(state.page * pageRows, (state.page + 1) * pageRows).forEach(function (index) {
        var tr = body.insertRow();
        data.rows[index].forEach(function (value, column) {
          var td = tr.insertCell();
          if (typeof value === "number") { td.className = "number"; td.title = String(value); }
          if (column === 0 && data.links[index]) {
            var link = document.createElement("a");
            link.href = data.links[index];
            link.textContent = format(value);
            td.appendChild(link);
          } else {
            td.textContent = format(value);
          }
        });
      });
      where.textContent = "rows " + (shown.length ? state.page * pageRows + 1 : 0) + "-" +
        Math.min((state.page + 1) * pageRows, shown.length) + " of " + shown.length +
        (shown.length < data.rows.length ? " (filtered from " + data.rows.length + ")" : "") +
        ", page " + (state.page + 1) + " of " + pages;
      previous.disabled = state.page === 0;
      next.disabled = state.page >= pages - 1;
    }
    var scroll = document.createElement("div");
    scroll.className = "scroll";
    scroll.appendChild(table);
    holder.appendChild(controls);
    holder.appendChild(scroll);
    render();
  }
  document.querySelectorAll("div.datatable").forEach(draw);
})();
"""

# Defence in depth behind escaping every text: a report page runs only its own table script and an embedded
# explorer's script (a srcdoc frame inherits this policy; the explorer's own adds to it), each allowed by its hash, so
# markup that slipped through could run nothing: no inline handler, no injected <script>, no javascript: URL. Figures
# and explorer pages still load by relative path (no default-src: the report opens from a file or any web server).
POLICY = f"script-src {script_source(SCRIPT)} {EXPLORER_SCRIPT}; object-src 'none'; base-uri 'none'; form-action 'none'"
