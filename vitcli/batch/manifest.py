"""A run's manifest (what was run, on what, which files, how long, what failed) and its summary table: views of the
run's record (vitcli.batch.record), built at the end of a run, on interrupt and by `vitcli merge`.

manifest.json:
    {"vitcli_manifest": 1, "name", "identity" (config + model hash: runs with equal identity can be merged),
     "config" (the invocation's config as run, after command-line overrides: a run's own, its `images` this run's;
     after a merge the latest invocation's, its `images` every invocation's), "provenance" (likewise),
     "shard" ("K/N" or null),
     "runs": [{"started", "host", "pid", "shard", "command", "images"}] (every invocation, oldest first),
     "result_names": [result names in configured order],
     "results": [{"image", "image_sha256", "subject", "experiment", "command", "settings", "files",
                  "compute_seconds", "write_seconds", "summary"}],
     "failures": [{"image", "experiment", "error"}],
     "not_in_this_run": [images recorded in the folder but not among this run's images; their results stay on disk],
     "timings": {experiment: {"results", "compute_seconds", "write_seconds"}}}
`files` are relative to the manifest's folder. summary.csv has one row per image (its canonical path and content;
sorted by image path): `image`,
`image_sha256`, then each experiment's headline numbers, experiments in configured order (else in natural order:
block 6 before block 12); a command configured more than once prefixes its columns with the result name
(`attention-b4-h1-q74.attention_cls_weight`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitcli.batch.schema import MANIFEST, problem
from vitcli.errors import UsageError, VitcliError

if TYPE_CHECKING:
    import pandas

VERSION = 1


def stem(kind: str, shard: str | None) -> str:
    """`manifest` / `summary`, or `manifest-shard2of4` so shards sharing a folder never overwrite each other."""
    if shard is None:
        return kind
    index, count = shard.split("/")
    return f"{kind}-shard{index}of{count}"


@dataclass
class Manifest:
    name: str
    identity: str
    config: dict[str, Any]
    provenance: dict[str, Any]
    shard: str | None
    results: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    result_names: list[str] = field(default_factory=list)
    # images recorded in the folder that are not among this run's images: their results stay on disk
    not_in_this_run: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: Any, path: Path | str = "manifest") -> Manifest:
        """A manifest read from `path`, checked whole (vitcli.batch.schema): a wrong shape is one line naming file
        and key."""
        if not isinstance(data, dict) or data.get("vitcli_manifest") != VERSION:
            raise VitcliError(f"{path} is not a vitcli run manifest (version 1)")
        found = problem(data, MANIFEST)
        if found:
            raise VitcliError(f"{path}: {found}")
        return cls(
            data["name"],
            data["identity"],
            data["config"],
            data["provenance"],
            data["shard"],
            list(data.get("results", [])),
            list(data.get("failures", [])),
            list(data.get("runs", [])),
            list(data.get("result_names", [])),
            list(data.get("not_in_this_run", [])),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "vitcli_manifest": VERSION,
            "name": self.name,
            "identity": self.identity,
            "shard": self.shard,
            "config": self.config,
            "provenance": self.provenance,
            "runs": self.runs,
            "result_names": self.result_names,
            "results": self.results,
            "failures": self.failures,
            "not_in_this_run": self.not_in_this_run,
            "timings": timings(self.results),
        }


def timings(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per experiment: how many results, the seconds computing them and the seconds writing their files."""
    totals: dict[str, dict[str, float]] = {}
    for entry in results:
        total = totals.setdefault(entry["experiment"], {"results": 0, "compute_seconds": 0.0, "write_seconds": 0.0})
        total["results"] += 1
        for key in ("compute_seconds", "write_seconds"):
            total[key] = round(total[key] + entry[key], 4)
    return totals


def natural_key(text: str) -> list[Any]:
    """`attention-b6` before `attention-b12`: digits compare as numbers."""
    return [
        (0, int(part)) if part.isascii() and part.isdigit() else (1, part)
        for part in re.split(r"([0-9]+)", text)
        if part
    ]


def result_order(results: list[dict[str, Any]], configured: list[str] | None = None) -> dict[str, int]:
    """Each result name's place: as configured, then the others in natural order."""
    names = sorted({entry["experiment"] for entry in results}, key=natural_key)
    configured = [name for name in configured or [] if name in set(names)]
    ordered = configured + [name for name in names if name not in set(configured)]
    return {name: place for place, name in enumerate(ordered)}


def summary_frame(results: list[dict[str, Any]], configured: list[str] | None = None) -> pandas.DataFrame:
    """One row per image, sorted by path; columns by experiment (as configured, else naturally ordered); results
    about the model alone (no image) are left out. A row is one image's content at one canonical path (its subject:
    a hash of the resolved path), however the path was spelled; a column whose numbers are all integers stays integer
    where some image lacks it (empty in the CSV, never 3.0)."""
    import pandas

    per_image = [entry for entry in results if entry.get("image")]
    repeated = Counter(command for command in {(e["command"], e["experiment"]) for e in per_image})
    commands = Counter(command for command, _ in repeated)
    order = result_order(per_image, configured)
    columns: dict[str, None] = {}
    rows: dict[tuple[str, str | None], dict[str, Any]] = {}
    for entry in sorted(per_image, key=lambda item: order[item["experiment"]]):
        key = (entry.get("subject", entry["image"]), entry["image_sha256"])
        row = rows.setdefault(key, {"image": entry["image"], "image_sha256": entry["image_sha256"]})
        prefix = f"{entry['experiment']}." if commands[entry["command"]] > 1 else ""
        values = {f"{prefix}{key}": value for key, value in entry["summary"].items()}
        row.update(values)
        columns.update(dict.fromkeys(values))
    if not rows:
        return pandas.DataFrame(columns=["image", "image_sha256"])
    frame = pandas.DataFrame(list(rows.values()), columns=["image", "image_sha256", *columns])
    for column in columns:
        values = [row[column] for row in rows.values() if row.get(column) is not None]
        if values and all(isinstance(value, int) and not isinstance(value, bool) for value in values):
            frame[column] = pandas.array([row.get(column) for row in rows.values()], dtype="Int64")
    return frame.sort_values(["image", "image_sha256"], kind="stable").reset_index(drop=True)


def plain_cells(frame: pandas.DataFrame) -> pandas.DataFrame:
    """summary_frame's cells as Python values for a page or a terminal table: a missing cell None (never pandas'
    `<NA>` of an integer column, nor NaN), integers Python ints."""
    return frame.astype(object).where(frame.notna(), None)


def read_manifest(path: Path) -> Manifest:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise VitcliError(f"cannot read {path}: {error}") from error
    return Manifest.from_json(data, path)


def read_manifests(folder: Path, required: bool = True) -> list[tuple[Path, Manifest]]:
    """Every manifest (whole runs and shards) in a run folder, each checked whole; none is a usage error when
    `required`."""
    found = sorted(folder.glob("manifest*.json"))
    if not found and required:
        raise UsageError(f"{folder} holds no manifest*.json: give the folder of a `vitcli run` (OUTPUT/RUN_NAME)")
    return [(path, read_manifest(path)) for path in found]
