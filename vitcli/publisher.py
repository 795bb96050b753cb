"""Publishing one computed result: its presentation written through the output store (JSON, CSV, the figure and any
extra files, atomically) and printed through the emitter; and reading back the results stored for a set of images.
The runner (vitcli.runner) computes; the publisher turns what it computed into files and output.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vitcli.jobs import Job, Presentation
from vitcli.output import Emitter, Messages, csv_text, json_text
from vitcli.store import OutputStore, ResultFiles


class Publisher:
    """Turns a computed result into files (through the store) and stdout output (through the emitter)."""

    def __init__(self, store: OutputStore, model_folder: str, emitter: Emitter, messages: Messages, provenance: dict):
        self.store = store
        self.model_folder = model_folder
        self.emitter = emitter
        self.messages = messages
        self.provenance = provenance
        self.figures = True  # False (--no-figures): JSON, CSV and extra files only
        self.announce_files = True  # one "wrote ..." line per result; a batch run reports its manifest instead
        self.keeps_caches = True  # False (the Python API's memory): jobs keep no cache in the store (Job.attach)

    def folder(self, subject: str) -> Path:
        return self.store.folder(self.model_folder, subject)

    def publish(
        self,
        subject: str,
        subject_json: dict[str, Any] | None,
        job: Job,
        result: Any,
        then: Callable[[list[Path], Presentation], None] | None = None,
    ) -> tuple[list[Path], Presentation]:
        """Present and write one result, then print it. Presentation, figure and files are interruptible; only the
        store's swap into place and `then(paths, presentation)` (a batch run's record) hold signals back."""
        presentation = job.present(result)
        provenance = job.provenance(self.provenance)
        document = {
            "provenance": provenance,
            "subject": subject_json,
            "experiment": {"command": job.command, "name": job.name(), "settings": job.settings()},
            "result": presentation.document,
        }
        rows = csv_rows(presentation.rows, subject_json, provenance, job.name())
        files: dict[str, Any] = {
            "json": json_text(document) + "\n",
            "csv": csv_text(rows),
        }
        if presentation.figure is not None and self.figures:
            files["png"] = _figure_writer(presentation.figure)
        for suffix, content in presentation.extra_files.items():
            if isinstance(content, list):
                content = csv_text(csv_rows(content, subject_json, provenance, job.name()))
            files[suffix] = content
        record = {"command": job.command, "settings": job.settings(), "subject": subject_json}
        stored = None if then is None else lambda paths: then(paths, presentation)
        paths = self.store.write(self.folder(subject), ResultFiles(job.name(), files, record), stored)
        if self.announce_files:
            self.messages.info("wrote " + ", ".join(str(path) for path in paths))
        if self.emitter.tidy_csv:
            (prefix,) = csv_rows([{}], subject_json, provenance, job.name())
            rows = [{**prefix, "key": key, "value": value} for key, value in presentation.summary.items()]
        self.emitter.result(document, presentation.table, rows)
        return paths, presentation


def csv_rows(rows: Sequence[dict[str, Any]], subject: dict[str, Any] | None, provenance: dict, name: str) -> list[dict]:
    """Every CSV row starts with the image and the model, so rows of many runs can be concatenated."""
    prefix = {
        "image": (subject or {}).get("path", ""),
        "image_sha256": (subject or {}).get("sha256", ""),
        "model": provenance.get("model", ""),
        "weights": provenance.get("weights_label", ""),
        "result": name,
    }
    return [{**prefix, **row} for row in rows]


def stored_documents(publisher: Publisher, subjects: Sequence[str], name: str) -> list[dict[str, Any]]:
    """The `result` bodies of result `name` stored for `subjects`, in that order; only files whose folder's index
    lists them with a matching hash count."""
    documents = []
    for subject in subjects:
        folder = publisher.store.root / publisher.model_folder / subject
        if publisher.store.is_complete(folder, name):
            try:
                documents.append(json.loads((folder / f"{name}.json").read_text(encoding="utf-8"))["result"])
            except (OSError, ValueError, KeyError, TypeError):
                continue  # indexed but not a result document: counted as missing, like a failed image
    return documents


def _figure_writer(build: Callable[[], Any]) -> Callable[[Any], None]:
    def write(stream: Any) -> None:
        import matplotlib.pyplot as plt

        figure = build()
        try:
            figure.savefig(stream, format="png", dpi=150, bbox_inches="tight")
        finally:
            plt.close(figure)

    return write
