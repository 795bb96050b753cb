"""A run's manifest (what was run, on what, which files, how long, what failed) and its summary table.

manifest.json:
    {"vitcli_manifest": 1, "name", "identity" (config + model hash: runs with equal identity can be merged),
     "config" (as run, after command-line overrides), "provenance", "shard" ("K/N" or null),
     "results": [{"image", "image_sha256", "subject", "experiment", "command", "settings", "files",
                  "compute_seconds", "write_seconds", "summary"}],
     "failures": [{"image", "experiment", "error"}],
     "timings": {experiment: {"results", "compute_seconds", "write_seconds"}}}
`files` are relative to the manifest's folder. summary.csv has one row per image (sorted by image path): `image`,
`image_sha256`, then each experiment's headline numbers; a command configured more than once prefixes its columns
with the result name (`attention-b4-h1-q74.attention_cls_weight`).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitcli.errors import UsageError, VitcliError

if TYPE_CHECKING:
    import pandas

    from vitcli.runner import Failure, Published

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

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        if not isinstance(data, dict) or data.get("vitcli_manifest") != VERSION:
            raise VitcliError("not a vitcli run manifest (version 1)")
        return cls(
            data["name"],
            data["identity"],
            data["config"],
            data["provenance"],
            data.get("shard"),
            list(data.get("results", [])),
            list(data.get("failures", [])),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "vitcli_manifest": VERSION,
            "name": self.name,
            "identity": self.identity,
            "shard": self.shard,
            "config": self.config,
            "provenance": self.provenance,
            "results": self.results,
            "failures": self.failures,
            "timings": timings(self.results),
        }

    def has(self, subject: str, experiment: str) -> bool:
        return any(entry["subject"] == subject and entry["experiment"] == experiment for entry in self.results)

    def add(self, published: Published, root: Path) -> None:
        """Record one published result (replacing an older entry of the same image and experiment)."""
        image = published.image or {}
        entry = {
            "image": image.get("path"),
            "image_sha256": image.get("sha256"),
            "subject": published.subject,
            "experiment": published.job.name(),
            "command": published.job.command,
            "settings": published.job.settings(),
            "files": [os.path.relpath(path, root) for path in published.files],
            "compute_seconds": round(published.compute_seconds, 4),
            "write_seconds": round(published.write_seconds, 4),
            "summary": published.summary,
        }
        self.results = [
            old
            for old in self.results
            if (old["subject"], old["experiment"]) != (entry["subject"], entry["experiment"])
        ]
        self.results.append(entry)
        self.failures = [
            old for old in self.failures if (old["image"], old["experiment"]) != (entry["image"], entry["experiment"])
        ]

    def fail(self, failure: Failure) -> None:
        self.failures.append({"image": failure.subject, "experiment": failure.job, "error": failure.message})


def timings(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per experiment: how many results, the seconds computing them and the seconds writing their files."""
    totals: dict[str, dict[str, float]] = {}
    for entry in results:
        total = totals.setdefault(entry["experiment"], {"results": 0, "compute_seconds": 0.0, "write_seconds": 0.0})
        total["results"] += 1
        for key in ("compute_seconds", "write_seconds"):
            total[key] = round(total[key] + entry[key], 4)
    return totals


def summary_frame(results: list[dict[str, Any]]) -> pandas.DataFrame:
    """One row per image, sorted by path; results about the model alone (no image) are left out."""
    import pandas

    per_image = [entry for entry in results if entry.get("image")]
    repeated = Counter(command for command in {(e["command"], e["experiment"]) for e in per_image})
    commands = Counter(command for command, _ in repeated)
    rows: dict[str, dict[str, Any]] = {}
    for entry in sorted(per_image, key=lambda item: item["experiment"]):
        row = rows.setdefault(entry["image"], {"image": entry["image"], "image_sha256": entry["image_sha256"]})
        prefix = f"{entry['experiment']}." if commands[entry["command"]] > 1 else ""
        row.update({f"{prefix}{key}": value for key, value in entry["summary"].items()})
    frame = pandas.DataFrame(list(rows.values()))
    if frame.empty:
        return pandas.DataFrame(columns=["image", "image_sha256"])
    return frame.sort_values("image", kind="stable").reset_index(drop=True)


def read_manifests(folder: Path) -> list[tuple[Path, Manifest]]:
    """Every manifest (whole runs and shards) in a run folder."""
    found = sorted(folder.glob("manifest*.json"))
    if not found:
        raise UsageError(f"{folder} holds no manifest*.json: give the folder of a `vitcli run` (OUTPUT/RUN_NAME)")
    manifests = []
    for path in found:
        try:
            manifests.append((path, Manifest.from_json(json.loads(path.read_text(encoding="utf-8")))))
        except (ValueError, KeyError, VitcliError) as error:
            raise VitcliError(f"cannot read {path}: {error}") from error
    return manifests


def merge(manifests: list[tuple[Path, Manifest]], into: Path) -> Manifest:
    """One manifest from runs of the same config and model; file paths rebased onto `into`."""
    (first_path, first), *others = manifests
    for path, other in others:
        if other.identity != first.identity:
            raise UsageError(
                f"cannot merge {path} with {first_path}: they ran different configs or models "
                f"({other.provenance.get('model')} vs {first.provenance.get('model')}); merge runs of one config only"
            )
    merged = Manifest(first.name, first.identity, first.config, first.provenance, None)
    for path, manifest in manifests:
        for entry in manifest.results:
            rebased = [os.path.relpath(path.parent / file, into) for file in entry["files"]]
            merged.results = [
                old
                for old in merged.results
                if (old["subject"], old["experiment"]) != (entry["subject"], entry["experiment"])
            ]
            merged.results.append({**entry, "files": rebased})
        merged.failures.extend(manifest.failures)
    done = {(entry["image"], entry["experiment"]) for entry in merged.results}
    merged.failures = [failure for failure in merged.failures if (failure["image"], failure["experiment"]) not in done]
    merged.results.sort(key=lambda entry: (entry["image"] or "", entry["experiment"]))
    return merged
