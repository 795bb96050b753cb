"""The explorer page in a real browser: Debian's Chromium, headless, driven by Playwright (never a downloaded browser).

The oracle is `vitcli attend`'s JSON for the same image, block, head and query: the numbers each panel draws (its
data-row) must equal it within float16's precision, and the colours on its heat canvas must be the colour map's
entries for those numbers. Skipped where Chromium or Playwright is missing, unless VITCLI_REQUIRE_BROWSER=1.
Broken on purpose once: indexing the heads as (head * blocks + block) in the page's script made every comparison fail.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import RANDOM_CPU

CHROMIUM = Path("/usr/bin/chromium")
REQUIRED = os.environ.get("VITCLI_REQUIRE_BROWSER") == "1"
# float16 rounding: relative 2^-11, absolute 2^-25 below float16's normal range.
RELATIVE, ABSOLUTE = 2.0**-11, 2.0**-25

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None

# A browser starts for each test (about 12 s for the module): `make test` leaves them to CI's full run.
pytestmark = pytest.mark.slow

if (sync_playwright is None or not CHROMIUM.exists()) and not REQUIRED:
    pytest.skip("needs Playwright and Debian's chromium (/usr/bin/chromium)", allow_module_level=True)


def run_cli(*args: str) -> str:
    from vitcli.cli import app

    result = CliRunner().invoke(app, [str(arg) for arg in args], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def explored(tmp_path_factory, newfoundland):
    """The page of the dog photo, and `vitcli attend`'s JSON: every block and head for P74 and P75, rollout of P74."""
    out = tmp_path_factory.mktemp("explore")
    run_cli("explore", newfoundland, *RANDOM_CPU, "-o", out, "--quiet")
    (page,) = out.glob("*/*/explore.html")

    def attend(*options: str) -> dict:
        (document,) = json.loads(run_cli("attend", newfoundland, *RANDOM_CPU, "-o", out, "--format", "json", *options))[
            "results"
        ]
        return document["result"]

    rows = {}
    for query in (74, 75):
        maps = attend("--view", "all-blocks", "--all-heads", "--query", str(query))["maps"]
        rows |= {(item["block"], item["head"], query): np.array(item["attention"]) for item in maps}
    rollout = np.array(attend("--view", "rollout", "--query", "74")["rollout"])
    return page, rows, rollout


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM))
        yield launched
        launched.close()


@pytest.fixture
def opened(browser, explored):
    """The page opened and ready; console errors and page errors collected."""
    page_path, _, _ = explored
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    started = time.perf_counter()
    page.goto(page_path.as_uri())
    page.wait_for_function("document.body.dataset.ready === '1'")
    print(f"\nexplorer page ({page_path.stat().st_size / 1e6:.2f} MB) open in {time.perf_counter() - started:.3f} s")
    yield page, errors
    page.close()


def click_patch(page, panel: str, row: int, col: int, query: int) -> float:
    stage = page.locator(f"{panel} .stage")
    box = stage.bounding_box()
    started = time.perf_counter()
    stage.click(position={"x": (col + 0.5) * box["width"] / 14, "y": (row + 0.5) * box["height"] / 14})
    page.wait_for_function(f"document.body.dataset.query === '{query}'")
    return time.perf_counter() - started


def choose_block(page, block: int) -> None:
    """Move the slider with its own keys, as a person would."""
    slider = page.locator("#block")
    slider.focus()
    slider.press("Home")
    for _ in range(block - 1):
        slider.press("ArrowRight")
    assert page.locator("#block-number").inner_text() == str(block)


def head_panel(page, head: int):
    return page.locator(f"#heads .panel[data-head='{head}']")


def drawn_row(panel) -> np.ndarray:
    return np.array(json.loads(panel.get_attribute("data-row")))


def assert_float16_equal(shown: np.ndarray, exact: np.ndarray) -> None:
    assert shown.shape == exact.shape
    bound = np.maximum(RELATIVE * np.abs(exact), ABSOLUTE)
    assert np.all(np.abs(shown - exact) <= bound), float(np.max(np.abs(shown - exact) / bound))


def heat_colours(panel) -> np.ndarray:
    """The heat canvas's pixels, one per patch, as (patches, 3) RGB."""
    pixels = panel.locator("canvas.heat").evaluate(
        "canvas => Array.from(canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data)"
    )
    return np.array(pixels).reshape(-1, 4)[:, :3]


def colour_levels(panel, lut: np.ndarray) -> np.ndarray:
    """Each patch's colour-map entry (0..255) on the panel's heat canvas; every pixel must be an entry."""
    matches = (heat_colours(panel)[:, None, :] == lut[None, :, :]).all(axis=-1)
    assert matches.any(axis=1).all(), "a patch colour is not on the colour scale"
    return matches.argmax(axis=1)


def inferno() -> np.ndarray:
    from vitcli.presentation.explore import colormap_hex

    hexes = colormap_hex("inferno")
    return np.array([[int(hexes[6 * i + at : 6 * i + at + 2], 16) for at in (0, 2, 4)] for i in range(256)])


def test_clicking_p74_draws_attends_rows_in_every_head_and_block(opened, explored):
    page, errors = opened
    _, rows, _ = explored
    seconds = click_patch(page, "#main", 5, 3, 74)
    print(f"click on P74 to every panel redrawn: {seconds:.3f} s")
    choose_block(page, 4)
    lut = inferno()
    for head in (1, 2, 3):
        panel = head_panel(page, head)
        assert panel.get_attribute("data-block") == "4" and panel.get_attribute("data-query") == "74"
        shown = drawn_row(panel)
        assert_float16_equal(shown, rows[(4, head, 74)])
        # Colours: each patch's pixel is exactly a colour-map entry, the entry for its weight on the panel's scale.
        low, top = float(panel.get_attribute("data-scale-min")), float(panel.get_attribute("data-scale-max"))
        level = low + colour_levels(panel, lut) / 255 * (top - low)
        assert np.all(np.abs(level - rows[(4, head, 74)][1:]) <= (top - low) / 510 + RELATIVE * top)
    assert errors == []


def test_the_colours_span_the_rows_own_range_and_start_at_0_when_asked(opened, explored):
    """The overlay's colour scale, as `vitcli attend --scale own|zero`: by default the shown patch values' own range
    (the mean row of P74 in block 4, from attend's rows; the heads' range over all three), written on the colour bar
    in percent, the smallest patch black and the largest the top colour; the "colours from 0" box starts it at 0,
    where the near-uniform row (random weights: 0.449-0.552%) keeps no dark patch. Failed before the fix: the scale
    started at 0."""
    page, errors = opened
    _, rows, _ = explored
    click_patch(page, "#main", 5, 3, 74)
    choose_block(page, 4)
    lut = inferno()
    main, heads = page.locator("#main .panel"), [head_panel(page, head) for head in (1, 2, 3)]
    mean = np.mean([rows[(4, head, 74)][1:] for head in (1, 2, 3)], axis=0)
    every_head = np.concatenate([rows[(4, head, 74)][1:] for head in (1, 2, 3)])

    def scale(locator) -> tuple[float, float]:
        return float(locator.get_attribute("data-scale-min")), float(locator.get_attribute("data-scale-max"))

    def bar(which: str) -> tuple[str, str, str]:
        return tuple(page.locator(f"#{which}-scale .{end}").inner_text() for end in ("bottom", "top", "range"))

    def close(shown: float, exact: float) -> bool:
        return abs(shown - exact) <= RELATIVE * abs(exact) + ABSOLUTE

    def percent_text(text: str, exact: float) -> bool:  # four decimals of the percentage
        return text.endswith("%") and abs(float(text[:-1]) - 100 * exact) <= 5e-5 + 100 * RELATIVE * exact

    low, top = scale(main)
    assert close(low, mean.min()) and close(top, mean.max())
    assert page.locator("body").get_attribute("data-scale") == "own"
    bottom, upper, words = bar("main")
    assert percent_text(bottom, mean.min()) and percent_text(upper, mean.max())
    assert words == f"colours span this map's own range, {bottom} to {upper}"
    levels = colour_levels(main, lut)
    assert levels[np.argmin(mean)] == 0 and levels[np.argmax(mean)] == 255
    for panel in heads:
        assert close(scale(panel)[0], every_head.min()) and close(scale(panel)[1], every_head.max())
    bottom, upper, words = bar("heads")
    assert percent_text(bottom, every_head.min()) and words.startswith("colours span the heads' own range, ")
    assert min(colour_levels(panel, lut).min() for panel in heads) == 0
    page.check("#from-zero")
    assert page.locator("body").get_attribute("data-scale") == "zero"
    assert scale(main) == (0.0, top)
    bottom, upper, words = bar("main")
    assert bottom == "0" and words == f"colours from 0 to this map's largest patch value, {upper}"
    assert colour_levels(main, lut).min() >= np.floor(255 * mean.min() / mean.max()) - 1
    assert mean.max() / mean.min() < 1.5  # the near-uniform row of the issue: from 0, its darkest patch is bright
    assert scale(heads[0])[0] == 0.0 and bar("heads")[0] == "0"
    page.uncheck("#from-zero")
    assert close(scale(main)[0], mean.min())
    assert errors == []


def test_changing_the_block_changes_the_overlay_to_that_blocks_rows(opened, explored):
    page, errors = opened
    _, rows, _ = explored
    click_patch(page, "#main", 5, 3, 74)
    choose_block(page, 1)
    first = drawn_row(head_panel(page, 2))
    assert_float16_equal(first, rows[(1, 2, 74)])
    started = time.perf_counter()
    choose_block(page, 12)
    print(f"block 1 -> 12 by the slider's keys: {time.perf_counter() - started:.3f} s")
    last = drawn_row(head_panel(page, 2))
    assert_float16_equal(last, rows[(12, 2, 74)])
    assert np.abs(first - last).max() > 0
    assert errors == []


def test_head_selector_mean_rollout_hover_and_arrow_keys(opened, explored):
    page, errors = opened
    _, rows, rollout = explored
    click_patch(page, "#heads .panel[data-head='1']", 5, 3, 74)
    choose_block(page, 4)
    main = page.locator("#main .panel")
    # The default main panel: the mean over heads of the float16 rows.
    mean = np.mean([rows[(4, head, 74)] for head in (1, 2, 3)], axis=0)
    assert np.all(np.abs(drawn_row(main) - mean) <= RELATIVE * mean + ABSOLUTE)
    page.select_option("#head", label="head 3")
    assert main.get_attribute("data-head") == "3"
    assert_float16_equal(drawn_row(main), rows[(4, 3, 74)])
    page.check("#rollout")
    assert main.get_attribute("data-head") == "rollout"
    assert_float16_equal(drawn_row(main), rollout)
    page.uncheck("#rollout")
    # Hover P75 in head 2's panel: the readout gives its token, row, col and weight.
    stage = head_panel(page, 2).locator(".stage")
    box = stage.bounding_box()
    stage.hover(position={"x": 4.5 * box["width"] / 14, "y": 5.5 * box["height"] / 14})
    readout = page.locator("#readout")
    assert [readout.get_attribute(f"data-{key}") for key in ("token", "row", "col")] == ["75", "5", "4"]
    weight = float(readout.get_attribute("data-weight"))
    assert abs(weight - rows[(4, 2, 74)][75]) <= RELATIVE * rows[(4, 2, 74)][75]
    assert "P75" in readout.inner_text() and "token 75, row 5, col 4" in readout.inner_text()
    # The arrow key moves the query one patch right: P75's rows.
    page.locator("h1").click()  # focus off the controls, as after reading the page
    page.keyboard.press("ArrowRight")
    page.wait_for_function("document.body.dataset.query === '75'")
    for head in (1, 2, 3):
        assert_float16_equal(drawn_row(head_panel(page, head)), rows[(4, head, 75)])
    page.click("#cls")
    page.wait_for_function("document.body.dataset.query === '0'")
    assert errors == []


def test_the_report_fragment_embeds_a_working_explorer(browser, explored, tmp_path):
    """explorer_fragment (what `vitcli report` embeds): the page inside a sandboxed iframe of another page still
    runs, reacts to a click, and logs no errors."""
    from vitcli.presentation.explore import explorer_fragment, is_explorer_page

    page_path, rows, _ = explored
    assert is_explorer_page(page_path) and not is_explorer_page(page_path.with_suffix(".json"))
    host = tmp_path / "host.html"
    host.write_text(
        "<!DOCTYPE html><html><head><meta charset='utf-8'><link rel='icon' href='data:,'></head><body>"
        + explorer_fragment(page_path.read_text(encoding="utf-8"), height=1100)
        + "</body></html>",
        encoding="utf-8",
    )
    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.goto(host.as_uri())
    frame = page.frame_locator("iframe.explorer")
    (inner,) = [candidate for candidate in page.frames if candidate != page.main_frame]
    inner.wait_for_function("document.body.dataset.ready === '1'")
    stage = frame.locator("#main .stage")
    box = stage.bounding_box()
    stage.click(position={"x": 3.5 * box["width"] / 14, "y": 5.5 * box["height"] / 14})
    inner.wait_for_function("document.body.dataset.query === '74'")
    assert_float16_equal(drawn_row(frame.locator("#heads .panel[data-head='1']")), rows[(1, 1, 74)])
    page.close()
    assert errors == []


def test_explain_maps_are_drawn_in_the_main_panel(browser, photo, tmp_path):
    """explore --explain: choosing a map in the main panel draws explain's own values on their own scale."""
    run_cli("explore", photo, *RANDOM_CPU, "-o", tmp_path, "--blocks", "1", "--explain", "--quiet")
    (page_path,) = tmp_path.glob("*/*/explore-b1-explain.html")
    (document,) = json.loads(run_cli("explain", photo, *RANDOM_CPU, "-o", tmp_path, "--format", "json"))["results"]
    maps = {item["method"]: np.array(item["values"], dtype=float).ravel() for item in document["result"]["maps"]}
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(page_path.as_uri())
    page.wait_for_function("document.body.dataset.ready === '1'")
    main = page.locator("#main .panel")
    for method in ("relevance", "gradcam"):
        page.select_option("#head", label=f"explain: {method}")
        assert main.get_attribute("data-head") == f"map:{method}"
        shown = np.array(json.loads(main.get_attribute("data-row"))[1:], dtype=float)
        np.testing.assert_array_equal(shown, maps[method])
        assert float(main.get_attribute("data-scale-max")) == np.nanmax(maps[method])
    page.close()
    assert errors == []
