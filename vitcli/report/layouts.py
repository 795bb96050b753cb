"""Which pages a report writes: one self-contained page for small runs, else an index beside one page per image."""

from __future__ import annotations

import os
from collections import defaultdict, deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any
from urllib.parse import quote

from vitcli.batch.manifest import Manifest, summary_frame
from vitcli.errors import UsageError
from vitcli.presentation.explorer_frame import is_explorer_page
from vitcli.report import sections
from vitcli.report.markup import page, text
from vitcli.report.reading import inside, read_result, read_run
from vitcli.store import OutputStore, ResultFiles

PAGE_NAME = "report"  # RUN_DIR/report.html, and report.html in each image's result folder
# The self-contained page is for runs within both bounds: at 1-2.5 MB of figures per image (and 4 MB per explorer
# page for ViT-Tiny), a few tens of images already make a page browsers load slowly.
SINGLE_FILE_IMAGES = 40
SINGLE_FILE_EMBEDDED_BYTES = 50 * 2**20
READERS, READ_AHEAD = 4, 32


@dataclass
class Run:
    folder: Path  # resolved
    manifest: Manifest
    sources: list[Path]
    by_image: dict[str, list[dict[str, Any]]]
    by_subject: dict[str, list[dict[str, Any]]]  # results about no single image: the model alone, image sets
    failures: dict[str, list[dict[str, Any]]]  # by image

    @classmethod
    def read(cls, run_dir: Path) -> Run:
        manifest, sources = read_run(run_dir)
        by_image, by_subject, failures = defaultdict(list), defaultdict(list), defaultdict(list)
        for entry in manifest.results:
            if entry.get("image"):
                by_image[entry["image"]].append(entry)
            else:
                by_subject[entry["subject"]].append(entry)
        for failure in manifest.failures:
            failures[failure.get("image")].append(failure)
        return cls(run_dir.resolve(), manifest, sources, dict(sorted(by_image.items())), by_subject, failures)

    def embedded_bytes(self) -> int:
        """The bytes of the files a single page would embed, the PNGs and explore's pages (their sizes from the file
        system, the files not read)."""
        return sum(
            path.stat().st_size
            for entry in self.manifest.results
            for path in (inside(self.folder, file) for file in entry["files"])
            if path
            and (path.suffix == ".png" or (entry.get("command") == "explore" and is_explorer_page(path)))
            and path.is_file()
        )

    def header(self) -> str:
        return sections.header(self.manifest, self.sources, len(self.by_image))

    def subjects(self, place: sections.Place, rows: int) -> list[str]:
        return [
            sections.subject_section(subject, [read_result(self.folder, entry, rows) for entry in entries], place)
            for subject, entries in sorted(self.by_subject.items(), key=lambda item: sections.subject_order(item[0]))
        ]


def write_report(run_dir: Path, rows: int = 5, single_file: bool | None = None) -> Path:
    """Write the report and return the page to open: RUN_DIR/report.html. `single_file` None chooses by size."""
    run = Run.read(run_dir)
    images, size = len(run.by_image), run.embedded_bytes()
    small = images <= SINGLE_FILE_IMAGES and size <= SINGLE_FILE_EMBEDDED_BYTES
    if single_file and not small:
        raise UsageError(
            f"--single-file is for runs of at most {SINGLE_FILE_IMAGES} images and {SINGLE_FILE_EMBEDDED_BYTES >> 20} "
            f"MB of figures and explorers; {run_dir} has {images} images and {size / 2**20:.0f} MB: leave it out for "
            "an index page with one page per image"
        )
    if single_file or (single_file is None and small):
        return _publish(run.folder, single_page(run, rows))
    return write_pages(run, rows)


def single_page(run: Run, rows: int) -> str:
    place = sections.Place(run.folder, embed=True)
    anchors = {image: f"image-{number}" for number, image in enumerate(run.by_image, start=1)}
    frame = summary_frame(run.manifest.results, run.manifest.result_names)
    body = [
        run.header(),
        sections.provenance_section(run.manifest, run.sources),
        sections.summary_section(
            frame, {image: f"#{anchor}" for image, anchor in anchors.items()}, False, run.manifest
        ),
        sections.failures_section(run.manifest.failures, interactive=False),
        sections.not_in_this_run_section(run.manifest.not_in_this_run),
        *(
            sections.image_body(image, _views(run, entries, rows), run.failures[image], place, anchors[image])
            for image, entries in run.by_image.items()
        ),
        *run.subjects(place, rows),
    ]
    return page(f"vitcli report: {run.manifest.name}", "\n".join(body), script=False)


def write_pages(run: Run, rows: int) -> Path:
    """One page per image in its result folder (written first, one at a time), then the index linking them."""
    index = run.folder / f"{PAGE_NAME}.html"
    links: dict[str, str | None] = {}
    for image, views in _read_ahead(run, rows):
        folders = [path.parent for view in views for path in view.paths.values() if path.parent.is_dir()]
        if not folders:
            links[image] = None  # nothing of it inside the run folder: no page to write
            continue
        place = sections.Place(folders[0], embed=False)
        back = f'<p class="meta"><a href="{place.link(index)}">{text(run.manifest.name)}: all images</a></p>'
        body = (
            back
            + sections.banner(run.manifest)
            + sections.image_body(image, views, run.failures[image], place, "image")
        )
        written = _publish(folders[0], page(f"{Path(image).name}: {run.manifest.name}", body, script=False))
        links[image] = quote(Path(os.path.relpath(written, run.folder)).as_posix())
    place = sections.Place(run.folder, embed=False)
    frame = summary_frame(run.manifest.results, run.manifest.result_names)
    body = [
        run.header(),
        '<p class="meta">one page per image, in its result folder: click an image in the summary</p>',
        sections.provenance_section(run.manifest, run.sources),
        sections.summary_section(frame, links, True, run.manifest),
        sections.failures_section(run.manifest.failures, interactive=True),
        sections.not_in_this_run_section(run.manifest.not_in_this_run),
        *run.subjects(place, rows),
    ]
    return _publish(run.folder, page(f"vitcli report: {run.manifest.name}", "\n".join(body), script=True))


def _views(run: Run, entries: list[dict[str, Any]], rows: int) -> list:
    return [read_result(run.folder, entry, rows) for entry in entries]


def _read_ahead(run: Run, rows: int) -> Iterator[tuple[str, list]]:
    """Each image's results read (hashes checked, CSVs excerpted) by READERS threads, READ_AHEAD images ahead of the
    caller: the reads overlap the writing of pages (each synced to disk by the store), and memory holds only the
    images in flight. Only reads run in the threads; every write stays in the calling thread."""
    items = iter(run.by_image.items())
    with ThreadPoolExecutor(READERS) as readers:
        pending = deque(readers.submit(_views, run, entries, rows) for _, entries in islice(items, READ_AHEAD))
        try:
            for image in run.by_image:
                views = pending.popleft().result()
                pending.extend(readers.submit(_views, run, entries, rows) for _, entries in islice(items, 1))
                yield image, views
        finally:  # interrupted (SIGINT, SIGTERM, an error): reads not yet started are dropped, not waited for
            for future in pending:
                future.cancel()


def _publish(folder: Path, html: str) -> Path:
    (path,) = OutputStore(folder).write(folder, ResultFiles(PAGE_NAME, {"html": html}))
    return path
