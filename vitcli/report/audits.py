"""explain's audits on a report page: one table per audit (sanity, robustness, ROAD, localisation, and any other the
JSON's `result.audits` holds), read from the result's JSON, drawing nothing that is not in it.

Generic over the audit objects: the settings are an audit's scalar fields (and short lists of scalars), the table is
its `methods` list with every column whose values are scalars (per-step lists such as ROAD's curves or the
sensitivities of each sample stay in the JSON), the definition its caption and a `note` (random weights) a warning.
"""

from __future__ import annotations

from typing import Any

from vitcli.report.markup import cell, text

ORDER = ("leaderboard", "sanity", "robustness", "road", "localisation")  # others follow by name
TITLES = {
    "leaderboard": "bench leaderboard: mean and 95% bootstrap interval per method and score",
    "sanity": "sanity checks: model-parameter randomisation",
    "robustness": "robustness: sensitivity to a small perturbation",
    "road": "ROAD: removal with noisy linear imputation",
    "localisation": "localisation against the mask",
}
WORDS = {"passed": ("pass", "FAIL"), "pointing_game": ("hit", "miss")}  # true, false; other booleans: yes, no
HEADERS = {"passed": "check"}
SHORT_LIST = 12  # lists of at most this many scalars are shown among the settings


def audit_tables(audits: dict[str, Any]) -> str:
    names = sorted(audits, key=lambda name: (ORDER.index(name) if name in ORDER else len(ORDER), name))
    return "".join(audit_table(name, audits[name]) for name in names if isinstance(audits[name], dict))


def audit_table(name: str, audit: dict[str, Any]) -> str:
    parts = [f'<h3 class="audit">{text(TITLES.get(name, name))}</h3>']
    if audit.get("note"):
        parts.append(f'<p class="problem">{text(audit["note"])}</p>')
    settings = [(key, value) for key, value in audit.items() if key not in ("definition", "note", "methods")]
    shown = [f"{key} {_setting(value)}" for key, value in settings if _setting(value) is not None]
    if shown:
        parts.append(f'<p class="meta">{text(" · ".join(shown))}</p>')
    rows = [row for row in audit.get("methods") or [] if isinstance(row, dict)]
    columns = [key for key in dict.fromkeys(key for row in rows for key in row) if _scalars(rows, key)]
    if rows and columns:
        head = "".join(f"<th>{text(HEADERS.get(column, column))}</th>" for column in columns)
        body = "".join(f"<tr>{''.join(_cell(column, row.get(column)) for column in columns)}</tr>" for row in rows)
        parts.append(f'<div class="scroll"><table><tr>{head}</tr>{body}</table></div>')
    if audit.get("definition"):
        parts.append(f'<p class="meta">{text(audit["definition"])}</p>')
    return "".join(parts)


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def _scalars(rows: list[dict[str, Any]], key: str) -> bool:
    return all(_scalar(row.get(key)) for row in rows)


def _setting(value: Any) -> str | None:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if _scalar(value) and value is not None:
        return f"{value:.4g}" if isinstance(value, float) else str(value)
    if isinstance(value, list) and 0 < len(value) <= SHORT_LIST and all(_scalar(item) for item in value):
        return ", ".join(_setting(item) or "" for item in value)
    return None


def _cell(column: str, value: Any) -> str:
    if isinstance(value, bool):
        yes, no = WORDS.get(column, ("yes", "no"))
        word = yes if value else no
        return f'<td class="fail">{word}</td>' if column == "passed" and not value else f"<td>{word}</td>"
    return cell(value)
