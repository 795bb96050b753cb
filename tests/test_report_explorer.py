"""`vitcli report` with explore's page embedded per image, and explain's audit tables (issues 22 and 23)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pandas
import pytest
from PIL import Image
from typer.testing import CliRunner

from vitcli.store import OutputStore, ResultFiles

from configs import write_config
from conftest import RANDOM_CPU
from report_pages import Page, Visit, report_benchmark


def add_explorer(run: Path, text: str) -> Path:
    """An `explore` result for the run's first image, written through the output store beside its other results (as
    `vitcli run` writes one) and listed in the manifest; returns the page's path."""
    manifest = json.loads((run / "manifest.json").read_text())
    first = manifest["results"][0]
    folder = (run / first["files"][0]).parent
    written = OutputStore(run).write(
        folder, ResultFiles("explore", {"json": "{}", "csv": "block,head\n1,1\n", "html": text})
    )
    files = [str(path.relative_to(run)) for path in written]
    manifest["results"].append({**first, "experiment": "explore", "command": "explore", "files": files, "summary": {}})
    (run / "manifest.json").write_text(json.dumps(manifest))
    return next(path for path in written if path.suffix == ".html")


def explorer_text(megabytes: float) -> str:
    """A stand-in explorer page of about this size: markup, quotes and ampersands that srcdoc must carry intact."""
    padding = base64.b64encode(bytes(range(256)) * int(megabytes * 2**20 * 3 / 4 / 256)).decode()
    return (
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>EXPLORER-MARK</title></head><body>'
        '<p title="a &amp; b">x < y &amp;&amp; \'z\'</p><script>document.body.dataset.ready = "1";</script>'
        f"<!-- {padding} --></body></html>"
    )


def test_an_explorer_is_inline_on_the_single_page_and_loaded_by_path_on_an_image_page(tmp_path, cli):
    """The single page carries the explorer's whole text in a sandboxed srcdoc iframe; an image's page only points at
    the file beside it, so it stays under 3 MB with a 4 MB explorer. Broken once on purpose (Place.explorer inlining
    in both layouts): the image's page was 4.2 MB and this failed."""
    run = report_benchmark().fake_run(tmp_path, 2)
    text = explorer_text(4)
    explorer = add_explorer(run, text)
    assert cli("report", run, "--single-file").exit_code == 0
    single = Page((run / "report.html").read_text(encoding="utf-8"))
    (frame,) = single.iframes
    assert frame["srcdoc"] == text and frame["sandbox"] == "allow-scripts" and "src" not in frame
    assert cli("report", run, "--pages").exit_code == 0
    index = run / "report.html"
    assert Page(index.read_text(encoding="utf-8")).iframes == []
    image_page = explorer.parent / "report.html"
    assert image_page.stat().st_size < 3e6 and "EXPLORER-MARK" not in image_page.read_text(encoding="utf-8")
    (frame,) = Page(image_page.read_text(encoding="utf-8")).iframes
    assert frame["sandbox"] == "allow-scripts" and "srcdoc" not in frame and frame["loading"] == "lazy"
    assert (image_page.parent / frame["src"]).resolve() == explorer.resolve()
    others = [path for path in run.glob("*/*/report.html") if path != image_page]
    assert len(others) == 1 and Page(others[0].read_text(encoding="utf-8")).iframes == []


@pytest.mark.parametrize("how", ["changed", "outside"])
def test_an_explorer_changed_since_the_run_or_outside_the_run_folder_is_not_embedded(tmp_path, cli, how):
    """Broken once on purpose (every explorer page taken as verified): the changed page was embedded and this
    failed."""
    run = report_benchmark().fake_run(tmp_path / "out", 2)
    explorer = add_explorer(run, explorer_text(0.01))
    if how == "changed":
        explorer.write_text(explorer.read_text() + "<!-- edited -->")
    else:
        outside = tmp_path / "elsewhere" / "explore.html"
        outside.parent.mkdir()
        outside.write_text(explorer_text(0.01))
        manifest = json.loads((run / "manifest.json").read_text())
        manifest["results"][-1]["files"] = ["../../elsewhere/explore.html"]
        (run / "manifest.json").write_text(json.dumps(manifest))
    for layout in ("--single-file", "--pages"):
        assert cli("report", run, layout).exit_code == 0
        pages = [run / "report.html", *run.glob("*/*/report.html")]
        text = "".join(path.read_text(encoding="utf-8") for path in pages)
        assert "<iframe" not in text and "EXPLORER-MARK" not in text
        expected = "changed since the run" if how == "changed" else "refused, outside the run folder (not read)"
        assert text.count(expected) == 1
        if how == "changed":
            assert text.count("its explorer is not embedded: explore.html") == 1


def test_the_explorer_counts_towards_the_single_page_bound(tmp_path, cli, monkeypatch):
    """With the bound between the run's figures and its figures plus the explorer, the single page is refused and the
    default layout is the index with pages. Broken once on purpose (only PNGs counted): the single page was
    written and this failed."""
    from vitcli.report import layouts

    run = report_benchmark().fake_run(tmp_path, 2)
    explorer = add_explorer(run, explorer_text(1))
    figures = sum(path.stat().st_size for path in run.glob("*/*/*.png"))
    assert layouts.Run.read(run).embedded_bytes() == figures + explorer.stat().st_size
    monkeypatch.setattr(layouts, "SINGLE_FILE_EMBEDDED_BYTES", figures + explorer.stat().st_size // 2)
    refused = cli("report", run, "--single-file")
    assert refused.exit_code == 2 and refused.stderr.startswith(
        "error: --single-file is for runs of at most 40 images and"
    )
    assert "MB of figures and explorers" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert not (run / "report.html").exists()
    assert cli("report", run).exit_code == 0
    assert "summary-data" in (run / "report.html").read_text(encoding="utf-8")  # the index of the pages layout


def test_audit_tables_show_each_audits_scalar_columns_settings_and_note_escaped():
    """Generic over explain's audit objects: list-valued columns (per-step curves) left in the JSON, booleans as
    words, short scalar lists among the settings, an unknown audit shown under its own name, text escaped."""
    from vitcli.report.audits import audit_tables

    audits = {
        "widget": {"definition": "<b>made up</b>", "methods": [{"method": "m<1>", "score": 0.123456, "flag": True}]},
        "sanity": {
            "note": "the weights are RANDOM",
            "seed": 3,
            "threshold": 0.5,
            "steps": [{"kind": "original"}],
            "methods": [
                {"method": "gradcam", "passed": False, "curve": [1.0, 0.5], "all_blocks_spearman_abs": 0.75},
                {"method": "rollout", "passed": True, "curve": [1.0, 0.1], "all_blocks_spearman_abs": 0.25},
            ],
        },
        "road": {"percents": [10, 20, 30], "clean_probability": 0.0123456, "methods": []},
    }
    text = audit_tables(audits)
    page = Page(f"<section><h2>x</h2>{text}</section>")
    assert page.sections[0]["h3"] == [
        "sanity checks: model-parameter randomisation", "ROAD: removal with noisy linear imputation", "widget",
    ]  # fmt: skip
    tables = {heading: rows for heading, rows in page.tables}
    assert tables["sanity checks: model-parameter randomisation"] == [
        ["method", "check", "all_blocks_spearman_abs"], ["gradcam", "FAIL", "0.75"], ["rollout", "pass", "0.25"],
    ]  # fmt: skip
    assert tables["widget"] == [["method", "score", "flag"], ["m<1>", "0.1235", "yes"]]
    assert "seed 3 · threshold 0.5" in text and "percents 10, 20, 30 · clean_probability 0.01235" in text
    assert '<p class="problem">the weights are RANDOM</p>' in text
    assert "<b>" not in text and "&lt;b&gt;made up&lt;/b&gt;" in text and "steps" not in text


AUDIT_CONFIG = """
name = "audits"
images = {images}
[model]
weights = "random"
[[experiments]]
command = "explore"
[[experiments]]
command = "explain"
method = ["gradcam", "rollout"]
sanity = true
robustness = true
samples = 2
road = true
masks = {masks}
"""


@pytest.fixture(scope="module")
def audit_run(tmp_path_factory, photo) -> Path:
    """A real `vitcli run` of explore and explain with every audit on the synthetic photo; its mask a trimap whose
    left half is the object (about 45 s of the run: the sanity check's 26 recomputations)."""
    from vitcli.cli import app

    folder = tmp_path_factory.mktemp("audits")
    masks = folder / "masks"
    masks.mkdir()
    width, height = Image.open(photo).size
    Image.fromarray(np.where(np.arange(width)[None, :] < width // 2, 1, 2).repeat(height, 0).astype(np.uint8)).save(
        masks / f"{photo.stem}.png"
    )
    config = write_config(folder, [photo], AUDIT_CONFIG, masks=masks)
    result = CliRunner().invoke(app, ["run", str(config), *RANDOM_CPU, "-o", str(folder / "out")])
    assert result.exit_code == 0, result.stderr
    return folder / "out" / "audits"


def entry_of(run: Path, command: str) -> dict:
    manifest = json.loads((run / "manifest.json").read_text())
    return next(entry for entry in manifest["results"] if entry["command"] == command)


def table_under(page: Page, heading: str) -> dict[str, dict[str, str]]:
    """The first table under an h3 as {first cell: {column: cell}}."""
    rows = next(rows for title, rows in page.tables if title == heading)
    head, *body = rows
    return {row[0]: dict(zip(head, row, strict=True)) for row in body}


@pytest.mark.slow
def test_the_single_page_shows_explains_audits_as_their_files_say_and_embeds_the_explorer(audit_run, report_of):
    """The audit tables read against explain's own files with independent readers: pass/fail from sanity.csv at the
    step where every block is randomised, the sensitivities' max and mean, ROAD's combined score from its curves, the
    pointing game from the .npy map's largest patch and the mask's object share; the sanity figure embedded byte for
    byte, every .npy a download link and nothing more; the explorer page inline. Broken once on purpose (the sanity
    table's `passed` column dropped as not a scalar): this failed."""
    text = report_of(audit_run, "--single-file")
    page = Page(text)
    explain = entry_of(audit_run, "explain")
    files = {Path(file).name.removeprefix(explain["experiment"]): audit_run / file for file in explain["files"]}
    document = json.loads(files[".json"].read_text())["result"]
    audits = document["audits"]
    sanity = pandas.read_csv(files[".sanity.csv"])
    all_blocks = sanity[(sanity["kind"] == "cascading") & (sanity["step"] == "blocks 12..1")].set_index("method")
    shown = table_under(page, "sanity checks: model-parameter randomisation")
    assert set(shown) == set(all_blocks.index) == {"gradcam", "rollout"}
    for method, row in shown.items():
        expected = all_blocks.loc[method, "spearman_abs"]
        assert row["check"] == ("pass" if expected < audits["sanity"]["threshold"] else "FAIL")
        assert float(row["all_blocks_spearman_abs"]) == pytest.approx(expected, rel=1e-3)
    robustness = table_under(page, "robustness: sensitivity to a small perturbation")
    road = table_under(page, "ROAD: removal with noisy linear imputation")
    pointing = table_under(page, "localisation against the mask")
    share = np.array(audits["localisation"]["object_share"])
    for method in ("gradcam", "rollout"):
        (samples,) = [item["sensitivities"] for item in audits["robustness"]["methods"] if item["method"] == method]
        assert float(robustness[method]["max_sensitivity"]) == pytest.approx(max(samples), rel=1e-3)
        assert float(robustness[method]["avg_sensitivity"]) == pytest.approx(np.mean(samples), rel=1e-3)
        (curves,) = [item for item in audits["road"]["methods"] if item["method"] == method]
        combined = (np.mean(curves["lerf"]) - np.mean(curves["morf"])) / 2
        assert float(road[method]["combined"]) == pytest.approx(combined, rel=1e-3)
        values = np.load(files[f".{method}.npy"])
        top = int(np.argmax(values))  # ties: the lower patch number, as explain orders them
        assert pointing[method]["top_patch"] == f"P{top + 1}"
        assert pointing[method]["pointing_game"] == ("hit" if share.flat[top] >= 0.5 else "miss")
    assert '<p class="problem">the weights are RANDOM: the randomisation test' in text
    # Figures: the maps and the sanity strip, embedded byte for byte; the arrays only linked, for download.
    embedded = {base64.b64decode(url.split(",", 1)[1]) for tag, _, url in page.urls if tag == "img"}
    assert {files[".png"].read_bytes(), files[".sanity.png"].read_bytes()} <= embedded
    arrays = {(audit_run / file).resolve() for file in explain["files"] if file.endswith(".npy")}
    assert len(arrays) == 4  # each map, and each map at every sanity step
    assert {(audit_run / url).resolve() for url in page.downloads} == arrays
    assert not [url for tag, _, url in page.urls if tag != "a" and ".npy" in url]
    # The explorer, inline and sandboxed: the page's own text.
    (frame,) = page.iframes
    (html_file,) = [file for file in entry_of(audit_run, "explore")["files"] if file.endswith(".html")]
    assert frame["srcdoc"] == (audit_run / html_file).read_text(encoding="utf-8")
    assert frame["sandbox"] == "allow-scripts"


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["--single-file", "--pages"])
def test_headless_chromium_clicks_p74_in_the_reports_explorer(browser, audit_run, report_of, photo, cli, layout):
    """In both layouts the explorer in the report runs: a click on P74 draws, in every head of block 1, the rows of
    `vitcli attend` for the same image and query (float16's precision), with no console error and nothing requested
    but files in the run folder. Broken once on purpose (the iframe sandboxed with no permission at all): the
    explorer never became ready and this failed."""
    report_of(audit_run, layout)
    explore = entry_of(audit_run, "explore")
    host = audit_run / "report.html"
    if layout == "--pages":
        host = (audit_run / explore["files"][0]).parent / "report.html"
        assert host.stat().st_size < 3e6
    (document,) = json.loads(
        cli(
            "attend", photo, *RANDOM_CPU, "--format", "json", "--view", "all-blocks", "--all-heads", "--query", "74"
        ).stdout
    )["results"]
    rows = {(item["block"], item["head"]): np.array(item["attention"]) for item in document["result"]["maps"]}
    visit = Visit(browser, host)
    page = visit.page
    iframe = page.locator("iframe.explorer")
    iframe.scroll_into_view_if_needed()  # an image's page loads its explorer lazily
    inner = iframe.element_handle().content_frame()
    inner.wait_for_function("document.body && document.body.dataset.ready === '1'")
    stage = page.frame_locator("iframe.explorer").locator("#main .stage")
    box = stage.bounding_box()
    stage.click(position={"x": 3.5 * box["width"] / 14, "y": 5.5 * box["height"] / 14})
    inner.wait_for_function("document.body.dataset.query === '74'")
    for head in (1, 2, 3):
        panel = page.frame_locator("iframe.explorer").locator(f"#heads .panel[data-head='{head}']")
        assert panel.get_attribute("data-block") == "1"
        shown, exact = np.array(json.loads(panel.get_attribute("data-row"))), rows[(1, head)]
        assert np.all(np.abs(shown - exact) <= np.maximum(2.0**-11 * np.abs(exact), 2.0**-25))  # float16 rounding
    visit.check(audit_run)
