"""An explorer page (`vitcli explore`'s .html) inside another page: a sandboxed iframe, holding the page's text
(`explorer_fragment`: one self-contained host, e.g. the report's single page or a notebook) or pointing at the file by
a relative path (`explorer_link`: the report's per-image pages, which stay small). Kept free of heavy imports (no
torch, no numpy) so `vitcli report` can use it."""

from __future__ import annotations

import html
from pathlib import Path

EXPLORER_PREFIX = "explore"  # result names of explorer pages start with it: explore.html, explore-b1-4.html
# The strictest sandbox the explorer works in: its script must run (it draws everything), nothing else is allowed.
# No allow-same-origin: the frame's origin stays opaque, so its script cannot read or change the host page, its storage
# or cookies (with allow-scripts, allow-same-origin would even let the frame remove its own sandbox); no forms, popups,
# modals, downloads or top navigation. The explorer's Content-Security-Policy adds that only its own script runs.
SANDBOX = "allow-scripts"


def is_explorer_page(path: Path) -> bool:
    """Whether a result file is an explorer page (explore.html, explore-b1-4.html, ...)."""
    return path.suffix == ".html" and path.stem.split("-")[0] == EXPLORER_PREFIX


def explorer_fragment(page: str, title: str = "attention explorer", height: int = 900) -> str:
    """An explorer page (the text of an explore .html file) as an HTML fragment for another page or a notebook: a
    sandboxed iframe holding the whole page (its script runs, nothing else is allowed), so the host page stays one
    self-contained file."""
    return _iframe(f'srcdoc="{html.escape(page, quote=True)}"', title, height, lazy=False)


def explorer_link(url: str, title: str = "attention explorer", height: int = 900) -> str:
    """The same sandboxed iframe loading the page from `url` (already a relative, URL-quoted path), loaded lazily:
    the host holds a few hundred bytes instead of the page's megabytes."""
    return _iframe(f'src="{html.escape(url, quote=True)}"', title, height, lazy=True)


def _iframe(source: str, title: str, height: int, lazy: bool) -> str:
    loading = ' loading="lazy"' if lazy else ""
    return (
        f'<iframe class="explorer" title="{html.escape(title)}" sandbox="{SANDBOX}"{loading} '
        f'style="width:100%;height:{height}px;border:1px solid #ccc" {source}></iframe>'
    )
