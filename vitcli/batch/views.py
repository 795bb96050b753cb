"""manifest.json and summary.csv as views of a run's record: built at the end of a run (and on interrupt) and by
`vitcli merge`, which also recomputes the results about the whole image set."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitcli.batch.manifest import Manifest, read_manifests, result_order, stem, summary_frame
from vitcli.batch.record import Record, read_record, record_files
from vitcli.errors import UsageError
from vitcli.output import json_text
from vitcli.store import OutputStore, ResultFiles, read_index

ACROSS = "-across-images"
VIEWS_LOCK = ".views.lock"  # processes sharing a run folder build its views one at a time


@dataclass
class Scope:
    """What one invocation's views cover: its images (its shard's share), and what else it knows of its inputs."""

    record_file: Path  # this process's record: its `run` line gives the views' config and provenance
    images: list[str]  # this invocation's images, canonical paths
    subjects: set[str]  # their subjects, the model's and their set's: the results shown
    input_subjects: set[str]  # the subjects of every image of the inputs, every shard's share
    failed_arguments: set[str] = field(default_factory=set)  # arguments that named no image: their failures shown


def record_view(record: Record, shard: str | None, scope: Scope | None = None) -> Manifest:
    """The manifest of a record: every result and failure it holds (`vitcli merge`), or those of one invocation's
    images (`scope`, a run's views); without a scope `config` and `provenance` are the latest invocation's.
    Failures that a later result made obsolete are left out. Images recorded but not among the inputs of the
    invocation are listed in `not_in_this_run`."""
    runs = [run for run in record.runs if shard is None or run["shard"] == shard] or record.runs
    own = [run for run in runs if scope is not None and run["file"] == scope.record_file]
    latest = (own or runs)[-1]
    results = [_entry(line) for key, line in record.results.items() if scope is None or key[0] in scope.subjects]
    done_at: dict[tuple[str | None, str | None], float] = {}
    for key, line in record.results.items():
        if scope is None or key[0] in scope.subjects:
            for done in ((line["image"], line["experiment"]), (line["image"], None)):
                done_at[done] = max(done_at.get(done, 0.0), line["at"])
    shown = None if scope is None else {*scope.images, *scope.failed_arguments, *scope.subjects}
    failures = [
        {key: line[key] for key in ("image", "experiment", "error")}
        for key, line in record.failures.items()
        if done_at.get(key, -1.0) < line["at"] and (shown is None or line["image"] in shown)
    ]
    manifest = Manifest(latest["name"], latest["identity"], dict(latest["config"]), latest["provenance"], shard)
    if scope is None:
        manifest.config["images"] = sorted({image for run in runs for image in run["config"].get("images", [])})
    else:
        manifest.config["images"] = sorted(scope.images)
        manifest.not_in_this_run = sorted(
            {
                line["image"]
                for key, line in record.results.items()
                if line["image"] and key[0] not in scope.input_subjects
            }
        )
    manifest.runs = [_run_summary(run) for run in runs]
    manifest.result_names = list(latest.get("result_names", []))
    manifest.failures = failures
    order = result_order(results, manifest.result_names)
    manifest.results = sorted(results, key=lambda entry: (entry["image"] or "", order[entry["experiment"]]))
    return manifest


def _entry(line: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in line.items() if key != "at"}


def _run_summary(run: dict[str, Any]) -> dict[str, Any]:
    return {
        "started": run.get("started"),
        "host": run.get("host"),
        "pid": run.get("pid"),
        "shard": run["shard"],
        "command": run["provenance"].get("command"),
        "images": len(run["config"].get("images", [])),
        "record": f"{Path(run['file']).parent.name}/{Path(run['file']).name}",
    }


def write_views(store: OutputStore, manifest: Manifest) -> list[Path]:
    """manifest.json, then summary.csv, each published through the store (whole or not at all)."""
    folder = store.folder()
    manifest_text = json_text(manifest.to_json()) + "\n"
    written = store.write(folder, ResultFiles(stem("manifest", manifest.shard), {"json": manifest_text}))
    summary_text = summary_frame(manifest.results, manifest.result_names).to_csv(index=False)
    return written + store.write(folder, ResultFiles(stem("summary", manifest.shard), {"csv": summary_text}))


def check_mergeable(items: list[tuple[Path, str, dict[str, Any], dict[str, Any]]]) -> None:
    """Runs merge only when they ran one config on one model: otherwise one line naming what differs."""
    first_path, identity, config, provenance = items[0]
    for path, other_identity, other_config, other_provenance in items[1:]:
        if other_identity == identity:
            continue
        differences = [
            f"{what} ({mine} vs {theirs})"
            for what, mine, theirs in (
                ("model", provenance.get("model"), other_provenance.get("model")),
                ("weights", provenance.get("weights_label"), other_provenance.get("weights_label")),
                (
                    "parameters_sha256",
                    _short(provenance.get("parameters_sha256")),
                    _short(other_provenance.get("parameters_sha256")),
                ),
            )
            if mine != theirs
        ]
        mine, theirs = config.get("experiments"), other_config.get("experiments")
        if mine != theirs:
            differences.append(f"experiments ({_first_difference(mine, theirs)})")
        raise UsageError(
            f"cannot merge {path} with {first_path}: they ran different configs or models; "
            f"they differ in {', '.join(differences) or 'identity'}; merge runs of one config only"
        )


def _short(text: Any) -> Any:
    return text[:12] if isinstance(text, str) else text


def _first_difference(mine: Any, theirs: Any) -> str:
    mine, theirs = mine or [], theirs or []
    for index in range(max(len(mine), len(theirs))):
        left = mine[index] if index < len(mine) else None
        right = theirs[index] if index < len(theirs) else None
        if left != right:
            return f"experiments[{index}]: {json.dumps(left)} vs {json.dumps(right)}"
    return "order"


def combined_config(configs: list[dict[str, Any]], into: Path) -> dict[str, Any]:
    """The latest config, with `images` covering every run's and `output_dir` every distinct one."""
    combined = dict(configs[-1])
    combined["images"] = sorted({image for config in configs for image in config.get("images", [])})
    output_dirs = list(dict.fromkeys(str(config.get("output_dir")) for config in configs))
    combined["output_dir"] = output_dirs[0] if len(output_dirs) == 1 else output_dirs
    return combined


def merge_manifests(manifests: list[tuple[Path, Manifest]], into: Path) -> Manifest:
    """One manifest from runs of the same config and model; file paths rebased onto `into`."""
    check_mergeable([(path, manifest.identity, manifest.config, manifest.provenance) for path, manifest in manifests])
    first = manifests[-1][1]
    merged = Manifest(first.name, first.identity, first.config, first.provenance, None)
    results: dict[tuple[str, str], dict[str, Any]] = {}
    failures: list[dict[str, Any]] = []
    for path, manifest in manifests:
        for entry in manifest.results:
            rebased = [os.path.relpath(path.parent / file, into) for file in entry["files"]]
            results[entry["subject"], entry["experiment"]] = {**entry, "files": rebased}
        failures.extend(manifest.failures)
        merged.runs.extend(manifest.runs)
        merged.result_names += [name for name in manifest.result_names if name not in merged.result_names]
    merged.config = combined_config([manifest.config for _, manifest in manifests], into)
    done = {(entry["image"], entry["experiment"]) for entry in results.values()}
    images_done = {image for image, _ in done}
    merged.failures = [
        failure
        for failure in failures
        if (failure["image"], failure["experiment"]) not in done
        and (failure["experiment"] is not None or failure["image"] not in images_done)
    ]
    merged.not_in_this_run = sorted(
        {image for _, manifest in manifests for image in manifest.not_in_this_run} - images_done
    )
    order = result_order(list(results.values()), merged.result_names)
    merged.results = sorted(results.values(), key=lambda entry: (entry["image"] or "", order[entry["experiment"]]))
    return merged


def merge_runs(
    folders: list[Path],
    into: Path,
    warn: Callable[[str], None],
    publish_set: Callable[..., Any],
    config: str | None = None,
) -> tuple[Manifest, list[Path]]:
    """One manifest of several run folders (their records, or the manifests of folders without one), the results
    about the whole image set recomputed, written as the views of `into`. Records of several configs in one folder
    are refused unless `config` (a config's recorded path or its identity) says which to merge."""
    records, listed = {}, {}
    for folder in folders:
        listed[folder] = read_manifests(folder, required=not record_files(folder))  # damaged ones refused either way
        record = read_record(folder, warn) if record_files(folder) else Record()
        if record.runs:
            records[folder] = record
        elif not listed[folder]:
            read_manifests(folder)  # no usable record, no manifest: the usage error naming the folder
    chosen = _chosen_identity(records, listed, config)
    manifests = []
    for folder in folders:
        if folder in records:
            record = records[folder]
            if chosen is not None and record.identities() != {chosen}:
                others = [run["file"] for run in record.runs if run["identity"] != chosen]
                record = read_record(folder, lambda _text: None, skip_files=others)  # warned at the first read
            manifests.append((folder / "manifest.json", record_view(record, None)))
        else:
            manifests += [(path, manifest) for path, manifest in listed[folder] if chosen in (None, manifest.identity)]
    merged = merge_manifests(manifests, into)
    merged.results = [entry for entry in merged.results if not entry["experiment"].endswith(ACROSS)]
    merged.results += publish_set(merged)
    store = OutputStore(into)
    with store.exclusive(VIEWS_LOCK):
        return merged, write_views(store, merged)


def _chosen_identity(
    records: dict[Path, Record], listed: dict[Path, list[tuple[Path, Manifest]]], config: str | None
) -> str | None:
    """The identity `config` names (None: merge everything, refused when one folder's records hold several)."""
    configs: dict[Path, dict[str, str]] = {}  # folder -> identity -> the config's recorded path
    for folder, record in records.items():
        configs[folder] = {run["identity"]: run["config"].get("path", run["name"]) for run in record.runs}
    for folder, manifests in listed.items():
        if folder not in records:
            configs[folder] = {
                manifest.identity: manifest.config.get("path", manifest.name) for _, manifest in manifests
            }
    if config is None:
        for folder, found in configs.items():
            if folder in records and len(found) > 1:
                raise UsageError(
                    f"{folder} holds records of {len(found)} configs: {_described(found)}; "
                    "merge one of them with --config PATH or --config IDENTITY"
                )
        return None
    every = {identity: path for found in configs.values() for identity, path in found.items()}
    matches = {identity for identity, path in every.items() if _names(config, identity, path)}
    if len(matches) != 1:
        what = "no run of the folders ran it" if not matches else f"it matches {len(matches)} configs"
        raise UsageError(f"--config {config}: {what}; recorded: {_described(every)}")
    (chosen,) = matches
    for folder, found in configs.items():
        if chosen not in found:
            raise UsageError(f"{folder} holds no run of --config {config}: recorded there: {_described(found)}")
    return chosen


def _names(config: str, identity: str, path: Any) -> bool:
    """Whether --config names this config: a prefix of 6 or more hex digits of its identity, or its file."""
    if len(config) >= 6 and identity.startswith(config.lower()):
        return True
    return isinstance(path, str) and (config == path or Path(config).resolve() == Path(path).resolve())


def _described(configs: dict[str, Any]) -> str:
    return " and ".join(f"{path} (identity {identity[:12]})" for identity, path in configs.items())


def stored_document(into: Path, entry: dict[str, Any]) -> dict[str, Any] | None:
    """The `result` body of a manifest entry's JSON file, if its folder's index lists it with a matching hash."""
    from vitcli.hashing import file_sha256

    for file in entry["files"]:
        if file.endswith(f"{entry['experiment']}.json"):
            path = into / file
            listed = read_index(path.parent)["results"].get(entry["experiment"], {}).get("files", {})
            try:
                if listed.get(path.name) == file_sha256(path):
                    return json.loads(path.read_text(encoding="utf-8"))["result"]
            except (OSError, ValueError, KeyError, TypeError):
                return None
    return None
