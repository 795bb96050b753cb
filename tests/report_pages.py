"""What the report tests share: an HTML reading of a page, the `report_of` fixture, and headless Chromium."""

from __future__ import annotations

import os
from html.parser import HTMLParser
from pathlib import Path

import pytest

# .ci/run sets it: there a missing browser fails the browser tests instead of skipping them.
BROWSER_REQUIRED = os.environ.get("VITCLI_REQUIRE_BROWSER") == "1"


class Page(HTMLParser):
    """What a browser would see: sections with their h2/h3 texts, every src/href, the text of table cells, the tables
    (under the last h3 before each), the iframes' attributes (values unescaped, as a browser reads them)."""

    def __init__(self, text: str):
        super().__init__()
        self.sections: list[dict] = []
        self.urls: list[tuple[str, str, str]] = []  # (tag, attribute, value)
        self.tags: set[str] = set()
        self.iframes: list[dict[str, str | None]] = []
        self.tables: list[tuple[str, list[list[str]]]] = []  # (the h3 above it, rows of cell texts)
        self.downloads: list[str] = []  # href of every link with the download attribute
        self._heading: str | None = None
        self._cell = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        if tag == "iframe":
            self.iframes.append(dict(attrs))
        if tag == "a" and "download" in dict(attrs):
            self.downloads.append(dict(attrs)["href"])
        if tag == "table":
            self.tables.append((self.sections[-1]["h3"][-1] if self.sections and self.sections[-1]["h3"] else "", []))
        if tag == "tr" and self.tables:
            self.tables[-1][1].append([])
        if tag in ("td", "th") and self.tables:
            self.tables[-1][1][-1].append("")
        if tag == "section":
            self.sections.append({"h2": "", "h3": [], "imgs": [], "cells": []})
        if tag in ("h2", "h3"):
            self._heading = tag
            if tag == "h3":
                self.sections[-1]["h3"].append("")
        if tag in ("td", "th"):
            self._cell = True
        for name, value in attrs:
            if name in ("src", "href"):
                self.urls.append((tag, name, value or ""))
                if tag == "img":
                    self.sections[-1]["imgs"].append(value)

    def handle_endtag(self, tag):
        if tag in ("h2", "h3"):
            self._heading = None
        if tag in ("td", "th"):
            self._cell = False

    def handle_data(self, data):
        if self._heading == "h2":
            self.sections[-1]["h2"] += data
        elif self._heading == "h3":
            self.sections[-1]["h3"][-1] += data
        elif self._cell and self.sections:
            self.sections[-1]["cells"].append(data)
        if self._cell and self.tables:
            self.tables[-1][1][-1][-1] += data


@pytest.fixture
def report_of(cli):
    def build(run: Path, *options: str) -> str:
        result = cli("report", run, *options)
        assert result.exit_code == 0, result.stderr
        return (run / "report.html").read_text(encoding="utf-8")

    return build


def image_sections(page: Page) -> dict[str, dict]:
    return {section["h2"]: section for section in page.sections}


CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium driven by Playwright (never a downloaded browser)."""
    if not CHROMIUM.is_file() and not BROWSER_REQUIRED:
        pytest.skip("Debian's chromium is not installed")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield chromium
        chromium.close()


class Visit:
    """A page opened in the browser with every console error, page error, request and failed request recorded."""

    def __init__(self, browser, path: Path):
        self.page = browser.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda message: message.type == "error" and self.errors.append(message.text))
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.page.on("requestfailed", lambda request: self.errors.append(f"failed: {request.url}"))
        self.page.goto(path.as_uri(), wait_until="load")

    def check(self, root: Path) -> None:
        """No errors; nothing requested but files inside the run folder; every figure decoded."""
        from urllib.parse import unquote, urlparse

        assert self.errors == []
        assert all(url.startswith(("file://", "data:")) for url in self.requests), self.requests
        for url in self.requests:
            if url.startswith("file://"):
                assert Path(unquote(urlparse(url).path)).resolve().is_relative_to(root.resolve())
        self.page.evaluate("() => Promise.all([...document.images].map(image => image.decode()))")
        widths = self.page.eval_on_selector_all("img", "images => images.map(image => image.naturalWidth)")
        assert all(width > 0 for width in widths)


def report_benchmark():
    """benchmarks/report.py, whose fake_run writes a run folder through the output store as `vitcli run` would."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "report.py"
    spec = importlib.util.spec_from_file_location("benchmark_report", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
