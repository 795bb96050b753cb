"""Hostile text on every page vitcli writes, in a real browser (Debian's Chromium driven by Playwright).

Class labels (a labels file) and image file names holding markup go through one `vitcli run` (predict, and explore
with explain's maps); its explorer pages, the report's single page and the report's per-image pages are opened,
every explain map is chosen, patches are clicked and hovered, CLS chips clicked, so every caption is drawn. The
oracle is the browser itself: no payload may run (window.__pwned stays undefined in the page and in every frame, no
dialog opens), no payload may load anything (no failed request, no console error), and each hostile text is shown
literally, as the labels file and the file names spell it. Skipped where Chromium or Playwright is missing, unless
VITCLI_REQUIRE_BROWSER=1. Failed before the fix: the explorer's caption was built with innerHTML, and choosing an
explain map ran the label's onerror.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from configs import write_config
from conftest import RANDOM_CPU

CHROMIUM = Path("/usr/bin/chromium")
REQUIRED = os.environ.get("VITCLI_REQUIRE_BROWSER") == "1"

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None

if (sync_playwright is None or not CHROMIUM.exists()) and not REQUIRED:
    pytest.skip("needs Playwright and Debian's chromium (/usr/bin/chromium)", allow_module_level=True)

# No commas: the explorer's caption names a class by its label's first comma-separated part (ImageNet's synonyms).
PAYLOADS = (
    '<img src=x onerror="window.__pwned=1">',
    "</script><script>window.__pwned=1</script>",
    '"><svg onload=window.__pwned=1>',
    "<!-- <script>window.__pwned=1</script> &amp; &lt;b&gt;",
    "<img src=y onerror=alert(1)>",
)
FILE_NAMES = ('<img src=x onerror="window.__pwned=1">.jpg', '"><svg onload=window.__pwned=1>.jpg')
CONFIG = """
name = "hostile"
images = {images}
[model]
weights = "random"
labels = "labels.txt"
[[experiments]]
command = "predict"
top-k = 3
[[experiments]]
command = "explore"
blocks = "1"
explain = true
"""


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory, photo) -> tuple[Path, list[str]]:
    """A real `vitcli run` over two images named with markup, its 1,000 class labels all markup."""
    from vitcli.cli import app

    folder = tmp_path_factory.mktemp("hostile")
    # Every label holds the first payload, whichever class explain's maps follow.
    labels = [f"{PAYLOADS[0]} {PAYLOADS[index % len(PAYLOADS)]} {index}" for index in range(1000)]
    (folder / "labels.txt").write_text("\n".join(labels) + "\n", encoding="utf-8")
    images = [folder / name for name in FILE_NAMES]
    for image in images:
        shutil.copy(photo, image)
    config = write_config(folder, images, CONFIG)
    result = CliRunner().invoke(app, ["run", str(config), *RANDOM_CPU, "-o", str(folder / "out")])
    assert result.exit_code == 0, result.stderr
    return folder / "out" / "hostile", labels


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield launched
        launched.close()


class Visit:
    """A page opened with every dialog, console error, page error and failed request recorded."""

    def __init__(self, browser, path: Path):
        self.page = browser.new_page(viewport={"width": 1400, "height": 1100})
        self.problems: list[str] = []
        self.page.on("dialog", self._dialog)
        self.page.on("console", lambda message: message.type == "error" and self.problems.append(message.text))
        self.page.on("pageerror", lambda error: self.problems.append(str(error)))
        self.page.on("requestfailed", lambda request: self.problems.append(f"failed: {request.url}"))
        self.page.goto(path.as_uri(), wait_until="load")

    def _dialog(self, dialog) -> None:
        self.problems.append(f"dialog: {dialog.message}")
        dialog.dismiss()

    def assert_nothing_ran(self) -> None:
        for frame in self.page.frames:
            assert frame.evaluate("() => typeof window.__pwned") == "undefined", frame.url
        assert self.problems == []


def poke_explorer(frame, labels: list[str], image: str) -> int:
    """Choose every entry of the main panel (heads, explain's maps), click and hover a patch, click the CLS chip;
    check the hostile texts shown literally. Returns the explain maps drawn."""
    frame.wait_for_function("document.body && document.body.dataset.ready === '1'")
    assert frame.locator("h1").inner_text() == f"attention explorer: {image}"
    assert frame.locator("#about").inner_text().startswith(f"{image} · ")
    maps = 0
    for value in frame.locator("#head option").evaluate_all("options => options.map(option => option.value)"):
        frame.locator("#head").select_option(value)
        stage = frame.locator("#main .stage")
        stage.scroll_into_view_if_needed()
        box = stage.bounding_box()
        stage.click(position={"x": 3.5 * box["width"] / 14, "y": 5.5 * box["height"] / 14})
        frame.wait_for_function("document.body.dataset.query === '74'")
        stage.hover(position={"x": 4.5 * box["width"] / 14, "y": 5.5 * box["height"] / 14})
        assert frame.evaluate("() => typeof window.__pwned") == "undefined", value
        if value.startswith("map:"):
            caption = frame.locator("#main .caption").inner_text()
            shown = re.search(r"for class (\d+) (.+)", caption)
            assert shown is not None, caption
            assert shown.group(2).strip() == labels[int(shown.group(1))], caption
            assert frame.locator("#main .caption img, #main .caption svg, #main .caption script").count() == 0
            maps += 1
        frame.locator("#main .cls").first.click(timeout=5000)
        frame.wait_for_function("document.body.dataset.query === '0'")
    # Nothing but the page's own elements: its four scripts, no svg, images only the crop and each panel's photo.
    assert frame.locator("script").count() == 4 and frame.locator("svg").count() == 0
    assert frame.locator("img").count() == frame.locator(".stage img, img#explorer-crop").count()
    return maps


def predicted_labels(run: Path) -> set[str]:
    """The labels predict wrote in its CSVs (read with the csv module, not from any page)."""
    return {
        row["label"]
        for table in run.glob("*/*/predict*.csv")
        for row in csv.DictReader(table.open(encoding="utf-8"))
        if row.get("label")
    }


@pytest.mark.slow
def test_hostile_labels_and_file_names_never_run_in_the_explorer(browser, hostile_run):
    run, labels = hostile_run
    pages = sorted(run.glob("*/*/explore*.html"))
    assert len(pages) == len(FILE_NAMES)
    for page_path in pages:
        visit = Visit(browser, page_path)
        image = visit.page.locator("#about").inner_text().split(" · ")[0]
        assert image in FILE_NAMES
        assert visit.page.title() == f"attention explorer: {image}"
        assert poke_explorer(visit.page.main_frame, labels, image) >= 1
        visit.assert_nothing_ran()
        visit.page.close()


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["--single-file", "--pages"])
def test_hostile_labels_and_file_names_never_run_in_the_report_or_its_explorers(browser, hostile_run, cli, layout):
    run, labels = hostile_run
    assert cli("report", run, layout).exit_code == 0
    hosts = [run / "report.html"] if layout == "--single-file" else sorted(run.glob("*/*/report.html"))
    assert len(hosts) == (1 if layout == "--single-file" else len(FILE_NAMES))
    explorers, shown_names = 0, set()
    for host in hosts:
        visit = Visit(browser, host)
        page = visit.page
        shown_names |= {text for text in page.locator("h2").all_inner_texts() if text in FILE_NAMES}
        body = page.locator("body").inner_text()
        assert predicted_labels(run) and any(label in body for label in predicted_labels(run))
        frames = page.locator("iframe.explorer")
        for index in range(frames.count()):
            frame = frames.nth(index)
            assert frame.get_attribute("sandbox") == "allow-scripts"
            frame.scroll_into_view_if_needed()  # an image's page loads its explorer lazily
            inner = frame.element_handle().content_frame()
            inner.wait_for_function("document.body && document.body.dataset.ready === '1'")
            image = inner.locator("#about").inner_text().split(" · ")[0]
            assert image in FILE_NAMES and frame.get_attribute("title") == f"attention explorer: {image}"
            explorers += poke_explorer(inner, labels, image) >= 1
        visit.assert_nothing_ran()
        page.close()
    assert shown_names == set(FILE_NAMES)
    assert explorers == len(FILE_NAMES)
    if layout == "--pages":
        index = Visit(browser, run / "report.html")
        names = index.page.locator("div.datatable tbody a").all_inner_texts()
        assert sorted(names) == sorted(FILE_NAMES)
        index.assert_nothing_ran()
        index.page.close()


# What a missed innerHTML (or a script built from data) would do: without a policy both set window.__pwned.
INJECT = """() => {
  const script = document.createElement('script');
  script.textContent = 'window.__pwned = 1';
  document.body.appendChild(script);
  document.body.insertAdjacentHTML('beforeend', '<img src="data:image/png;base64,AAAA" onerror="window.__pwned = 2">');
  return new Promise((done) => setTimeout(done, 300));
}"""


@pytest.mark.slow
def test_the_pages_policies_refuse_script_that_markup_could_carry(browser, hostile_run, cli):
    """Defence in depth behind text-only insertion: the explorer's and the report's Content-Security-Policy let each
    page run its own script and nothing else, in the explorer alone, the single page, and the explorer inside it (a
    srcdoc frame inherits the report's policy). Broken once on purpose (no policy in either page): window.__pwned was
    set in every frame and this failed."""
    run, _ = hostile_run
    assert cli("report", run, "--single-file").exit_code == 0
    explorer = sorted(run.glob("*/*/explore*.html"))[0]
    for path, frames in ((explorer, 1), (run / "report.html", 1 + len(FILE_NAMES))):
        visit = Visit(browser, path)
        assert len(visit.page.frames) == frames
        for frame in visit.page.frames[1:] if frames > 1 else visit.page.frames:
            frame.wait_for_function("document.body && document.body.dataset.ready === '1'")  # its own script ran
        for frame in visit.page.frames:
            frame.evaluate(INJECT)
            assert frame.evaluate("() => typeof window.__pwned") == "undefined", frame.url
        assert visit.problems and all("Content Security Policy" in problem for problem in visit.problems)
        visit.page.close()
