"""`vitcli report RUN_DIR`: one self-contained HTML page per batch run.

One real run (predict + patches on two images, one with a hostile file name) is built once for the module; the page
is parsed with html.parser (an independent reading of what a browser sees) and, where Debian's chromium is installed,
rendered headless.
"""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pandas
import pytest
from PIL import Image
from typer.testing import CliRunner

from vitcli.store import OutputStore, ResultFiles

from configs import write_config
from conftest import RANDOM_CPU
from report_pages import BROWSER_REQUIRED, Page, Visit, image_sections

HOSTILE = '<script>&"x.jpg'
CONFIG = """
name = "pagetest"
images = {images}
[model]
weights = "random"
[[experiments]]
command = "predict"
top-k = 3
[[experiments]]
command = "patches"
patch = ["63"]
values = 4
"""


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory, photo) -> Path:
    """OUTPUT/pagetest of a real `vitcli run` (built once: module scope, so not the function-scoped `cli`)."""
    from vitcli.cli import app

    folder = tmp_path_factory.mktemp("report")
    hostile = folder / HOSTILE
    shutil.copy(photo, hostile)
    config = write_config(folder, [photo, hostile], CONFIG)
    result = CliRunner().invoke(app, ["run", str(config), *RANDOM_CPU, "-o", str(folder / "out")])
    assert result.exit_code == 0, result.stderr
    return folder / "out" / "pagetest"


@pytest.mark.slow
def test_the_page_is_self_contained_and_embeds_every_listed_figure_byte_for_byte(run_folder, report_of):
    text = report_of(run_folder)
    page = Page(text)
    assert not {"script", "link", "iframe", "object", "embed"} & page.tags
    assert "url(" not in text and "@import" not in text
    remote = [url for _, _, url in page.urls if url.lower().startswith(("http:", "https:", "//"))]
    assert remote == []
    manifest = json.loads((run_folder / "manifest.json").read_text())
    pngs = [run_folder / file for entry in manifest["results"] for file in entry["files"] if file.endswith(".png")]
    embedded = [url for tag, name, url in page.urls if tag == "img"]
    assert len(embedded) == len(pngs) == 4  # predict and patches draw a figure for each of two images
    assert all(url.startswith("data:image/png;base64,") for url in embedded)
    decoded = sorted(base64.b64decode(url.split(",", 1)[1]) for url in embedded)
    assert decoded == sorted(path.read_bytes() for path in pngs)
    # The page went through the output store: indexed with its hash like every result file.
    assert OutputStore(run_folder).is_complete(run_folder, "report")


@pytest.mark.slow
def test_every_image_has_a_section_with_every_result_its_numbers_and_the_configured_patch(run_folder, report_of):
    page = Page(report_of(run_folder))
    sections = image_sections(page)
    manifest = json.loads((run_folder / "manifest.json").read_text())
    for image in {entry["image"] for entry in manifest["results"]}:
        section = sections[Path(image).name]
        expected = {entry["experiment"] for entry in manifest["results"] if entry["image"] == image}
        assert set(section["h3"]) == expected == {"predict-k3", "patches-p63-v4"}
        assert len(section["imgs"]) == 2  # the patches figure (the crop) and predict's top-k bars
        cells = set(section["cells"])
        # The top-k labels, read from the CSV independently of the page code.
        (predict,) = [
            entry for entry in manifest["results"] if entry["image"] == image and entry["command"] == "predict"
        ]
        top = pandas.read_csv(run_folder / next(file for file in predict["files"] if file.endswith(".csv")))
        assert set(top["label"]) <= cells
        assert "P63" in cells and "patches_projection_max_difference" in cells
    summary = image_sections(page)["Summary"]
    assert {"predict_top1_label", "patches_projection_max_difference"} <= set(summary["cells"])
    assert "RANDOM (seed 0) WEIGHTS: untrained model" in report_of(run_folder)


@pytest.mark.slow
def test_a_hostile_file_name_is_escaped_everywhere(run_folder, report_of):
    text = report_of(run_folder)
    assert "<script" not in text.lower()
    assert "&lt;script&gt;&amp;&quot;x.jpg" in text
    # Escaped, it reads back as the plain name: a heading, not markup.
    assert HOSTILE in image_sections(Page(text))


def test_the_index_script_has_no_html_sink_and_its_table_json_cannot_close_its_script():
    """The index's table script puts every cell in with textContent; a data table's JSON carries any text (a file
    name ending its script, opening a comment, U+2028) inside its <script> element, read back intact by a parser."""
    from vitcli.report.markup import SCRIPT, data_table

    assert re.findall(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|srcdoc|\beval\(", SCRIPT) == []
    name = "</script><script>window.__pwned=1</script><!-- \u2028\u2029 & \"'"

    class Scripts(HTMLParser):
        def __init__(self):
            super().__init__()
            self.scripts: list[str] = []
            self.tags: list[str] = []

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)
            if tag == "script":
                self.scripts.append("")

        def handle_data(self, data):
            if self.tags and self.tags[-1] == "script":
                self.scripts[-1] += data

    parsed = Scripts()
    parsed.feed(data_table("summary-data", ["image", name], [[name, 1.5]], [f"{name}.html"]))
    assert parsed.tags == ["div", "script"] and len(parsed.scripts) == 1
    assert not set(parsed.scripts[0]) & set("<>&\u2028\u2029")
    data = json.loads(parsed.scripts[0])
    assert data["columns"][1] == data["rows"][0][0] == name and data["links"] == [f"{name}.html"]


@pytest.mark.slow
def test_shards_results_about_the_model_unknown_experiments_and_failures_all_appear(run_folder, tmp_path, report_of):
    run = tmp_path / "run"
    shutil.copytree(run_folder, run)
    # An experiment the page knows nothing about, about the model alone, written through the store like any result.
    folder = run / "model-folder" / "model"
    folder.mkdir(parents=True)
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), (10, 200, 30)).save(buffer, format="PNG")
    csv_text = "image,model,result,size,score\n,m,widget-s3,3,0.25\n,m,widget-s3,4,0.5\n,m,widget-s3,5,0.75\n"
    OutputStore(folder).write(
        folder,
        ResultFiles(
            "widget-s3",
            {
                "png": lambda stream: stream.write(buffer.getvalue()),
                "csv": lambda stream: stream.write(csv_text.encode()),
            },
        ),
    )
    manifest = json.loads((run / "manifest.json").read_text())
    widget = {
        **manifest["results"][0],  # whatever else an entry holds
        "compute_seconds": 0.5,
        "write_seconds": 0.25,
        "image": None, "image_sha256": None, "subject": "model", "experiment": "widget-s3", "command": "widget",
        "settings": {"size": 3}, "files": ["model-folder/model/widget-s3.png", "model-folder/model/widget-s3.csv"],
        "summary": {"widget_best": 0.75},
    }  # fmt: skip
    failure = {"image": "/photos/<b>broken</b>.jpg", "experiment": "predict-k3", "error": "not an image <b>"}
    (run / "manifest.json").unlink()
    halves = [manifest["results"][::2] + [widget], manifest["results"][1::2]]
    for index, results in enumerate(halves, start=1):
        shard = {**manifest, "shard": f"{index}/2", "results": results, "failures": [failure] if index == 2 else []}
        (run / f"manifest-shard{index}of2.json").write_text(json.dumps(shard))
    text = report_of(run, "--rows", "2")
    page = Page(text)
    sections = image_sections(page)
    assert sections["The model alone"]["h3"] == ["widget-s3"]
    assert {"widget-s3", "compute_seconds", "write_seconds", "0.5", "0.25"} <= set(sections["Summary"]["cells"])
    assert sections["The model alone"]["imgs"] == [
        "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    ]
    # Its headline number, then --rows 2: the first two CSV rows, without the framework's columns.
    assert sections["The model alone"]["cells"] == ["widget_best", "0.75", "size", "score", "3", "0.25", "4", "0.5"]
    assert "Failures (1)" in sections and "not an image <b>" in sections["Failures (1)"]["cells"]
    assert "<b>" not in text
    for image in {entry["image"] for entry in manifest["results"]}:
        assert set(sections[Path(image).name]["h3"]) == {"predict-k3", "patches-p63-v4"}


@pytest.mark.slow
def test_a_changed_result_file_is_flagged_on_the_page(run_folder, tmp_path, report_of):
    run = tmp_path / "run"
    shutil.copytree(run_folder, run)
    (changed,) = run.glob("*/synthetic-*/predict-k3.csv")
    changed.write_text(changed.read_text() + "\n")
    text = report_of(run)
    assert text.count("changed since the run") == 1


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None and not BROWSER_REQUIRED, reason="Debian's chromium is absent")
def test_headless_chromium_renders_the_page_with_its_banner_and_figures(run_folder, report_of, tmp_path):
    report_of(run_folder)
    screenshot = tmp_path / "page.png"
    subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={screenshot}",
         "--window-size=1200,2000", (run_folder / "report.html").as_uri()],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    pixels = Image.open(screenshot).convert("RGB")
    colours = pixels.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 1000  # text, tables and the embedded photo crop, not a blank page
    # The random-weights banner (#b00020) is drawn: the style sheet applied.
    banner = sum(count for count, colour in colours if colour == (0xB0, 0x00, 0x20))
    assert banner > 1200 * 10


def test_a_folder_without_a_manifest_is_a_usage_error(cli, workdir):
    (workdir / "empty").mkdir()
    result = cli("report", workdir / "empty")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and "manifest" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    missing = cli("report", workdir / "nowhere")
    assert missing.exit_code == 2 and "not a folder" in missing.stderr
    assert not (workdir / "empty" / "report.html").exists()


@pytest.mark.parametrize(
    ("command", "column", "largest_first"), [("occlude-patches", "drop_points", True), ("explain", "rank", False)]
)
def test_ranked_experiments_show_their_strongest_rows_first(tmp_path, command, column, largest_first):
    from vitcli.report.reading import excerpt

    values = ["0.5", "nan", "3.25", "-1", "2", "0.75"]
    path = tmp_path / "ranked.csv"
    path.write_text("image,patch," + column + "\n" + "".join(f"x.jpg,P{n},{v}\n" for n, v in enumerate(values, 1)))
    shown = excerpt(path, {"command": command, "settings": {}}, 3)
    numbers = [(float(value), f"P{n}") for n, value in enumerate(values, 1) if value != "nan"]
    expected = sorted(numbers, reverse=largest_first)[:3]
    assert shown.columns == ["patch", column] and shown.total_rows == len(values)
    assert [row[0] for row in shown.rows] == [patch for _, patch in expected]


@pytest.mark.slow
def test_headless_chromium_renders_the_single_page_without_errors_or_requests(browser, run_folder, report_of):
    report_of(run_folder, "--single-file")
    visit = Visit(browser, run_folder / "report.html")
    visit.check(run_folder)
    assert visit.requests == [(run_folder / "report.html").as_uri()]  # the figures are embedded
    assert visit.page.locator(".warning").first.inner_text().startswith("RANDOM (seed 0) WEIGHTS")
