"""`vitcli probe` as a library: its Job, a linear probe on a data folder (an ImageFolder) computed once per run, and
the builder that `vitcli run` configs call; the command and the Python API (vitcli.probe) build the same Job.

Where the run keeps files (not the Python API), the Job keeps the features and the adapted checkpoint in the output
store: features beside the results of the same weights (the model folder names them), under CACHE_SUBJECT, in a file
named by the parameters' SHA-256 too, so other weights never read them.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Annotated, Any

import typer

from vitcli.errors import UsageError
from vitcli.jobs import Job, Presentation, Steps, builds_jobs
from vitcli.naming import image_subject, result_name, setting
from vitcli.spec import check_seed

CACHE_SUBJECT = "probe-features"


class ProbeJob(Job):
    """One result about a data folder, computed once per run (scope "model": not about the run's images), filed under
    the folder's own subject, `data-NAME-HASH`."""

    command = "probe"
    needs_classes = False  # the probe brings its own head
    scope = "model"

    def __init__(
        self,
        val_fraction: float = 0.2,
        split_seed: int = 0,
        weight_decay: float = 1e-4,
        data_dir: Path | None = None,
    ):
        if not 0.0 <= val_fraction < 1.0:
            raise UsageError(f"--val-fraction must be at least 0 and below 1, not {val_fraction}")
        if weight_decay < 0:
            raise UsageError(f"--weight-decay must be at least 0, not {weight_decay}")
        check_seed("--split-seed", split_seed)
        self.val_fraction = val_fraction
        self.split_seed = split_seed
        self.weight_decay = weight_decay
        self.data_dir = data_dir
        self.publisher: Any = None  # the run's, where it keeps files (attach); None: no cache and no checkpoint
        self.steps = Steps()  # the command shows the features' progress here

    @cached_property
    def image_folder(self) -> Any:
        """The data folder's classes and images (refused with a usage error when it is no ImageFolder)."""
        from vitcli.experiments.probe import read_image_folder

        if self.data_dir is None:
            raise UsageError("probe needs DATA_DIR: a folder with one subfolder of images per class")
        return read_image_folder(self.data_dir)

    def name(self) -> str:
        return result_name(
            "probe",
            setting("vf", float(self.val_fraction)),
            setting("ss", self.split_seed),
            setting("wd", float(self.weight_decay)),
        )

    def settings(self) -> dict[str, Any]:
        return {"val_fraction": self.val_fraction, "split_seed": self.split_seed, "weight_decay": self.weight_decay}

    def once_subject(self) -> str | None:
        return f"data-{image_subject(self.data_dir)}"

    def attach(self, publisher: Any) -> None:
        self.publisher = publisher

    def compute_once(self, model: Any) -> Any:
        from vitcli.experiments.probe import run_probe

        folder = self.image_folder
        cache_name = f"features-{model.parameter_sha256[:16]}"
        cached = {} if self.publisher is None else _read_cache(self.publisher, cache_name)
        shown = {"total": -1, "done": 0}

        def on_progress(done: int, total: int) -> None:
            if total != shown["total"]:
                self.steps.start(total, "features")
                shown.update(total=total, done=0)
            self.steps.advance(done - shown["done"])
            shown["done"] = done

        result, new = run_probe(
            model, folder, cached, self.val_fraction, self.split_seed, self.weight_decay, on_progress
        )
        if self.publisher is not None:
            if new:
                _write_cache(self.publisher, cache_name, {**cached, **new}, model.name)
            self._write_checkpoint(model, result)
        return result

    def subject_of(self, result: Any) -> dict[str, Any]:
        from vitcli.filenames import escaped_path

        return {
            "path": escaped_path(self.data_dir),
            "classes": list(result.classes),
            "images": len(self.image_folder.paths),
        }

    def _write_checkpoint(self, model: Any, result: Any) -> None:
        """NAME-checkpoint.safetensors (with its record as JSON in its metadata, which the loader reads back) and
        NAME-checkpoint.labels.txt, the names the loader looks for beside a checkpoint."""
        import json

        from safetensors.torch import save

        from vitcli.experiments.probe import adapted_checkpoint
        from vitcli.store import ResultFiles
        from vitcli.tower_names import is_tower
        from vitcli.weights import RECORD_KEY

        messages = self.publisher.messages
        if is_tower(model.name):  # their --checkpoint loads no classifier head (hf: refuses it, open_clip: no head)
            messages.info(
                f"no checkpoint written: --checkpoint cannot give {model.name} a classifier head (timm models only)"
            )
            return
        state, classes = adapted_checkpoint(model, result)
        record = {
            "kind": "linear probe",
            "backbone": model.backbone_record(),
            "probe": {
                **self.settings(),
                "data": str(self.data_dir),
                "classes": classes,
                "images": len(self.image_folder.paths),
            },
        }
        metadata = {"format": "pt", RECORD_KEY: json.dumps(record, sort_keys=True)}
        files = {"safetensors": save(state, metadata=metadata), "labels.txt": "\n".join(classes) + "\n"}
        entry = {"command": self.command, "settings": self.settings(), "contents": "adapted checkpoint and class names"}
        folder = self.publisher.folder(self.once_subject())
        written = self.publisher.store.write(folder, ResultFiles(f"{self.name()}-checkpoint", files, entry))
        messages.info(
            f"wrote {written[0]} and its class names {written[1]}; use it with "
            f"`vitcli predict IMAGE --model {model.name} --checkpoint {written[0]}`"
        )

    def present(self, result: Any) -> Presentation:
        from vitcli.presentation import probe as view

        return Presentation.of(view, result)


def _read_cache(publisher: Any, name: str) -> dict[str, Any]:
    """Features of earlier runs with these weights; only a cache the store's index vouches for is read."""
    from safetensors.torch import load_file

    folder = publisher.folder(CACHE_SUBJECT)
    if not publisher.store.is_complete(folder, name):
        return {}
    return dict(load_file(str(folder / f"{name}.safetensors")))


def _write_cache(publisher: Any, name: str, features: dict[str, Any], model_name: str) -> None:
    from safetensors.torch import save

    from vitcli.store import ResultFiles

    data = save({digest: feature.contiguous() for digest, feature in features.items()})
    record = {"command": "probe", "contents": f"{model_name} head-input features by image SHA-256"}
    publisher.store.write(publisher.folder(CACHE_SUBJECT), ResultFiles(name, {"safetensors": data}, record))


@builds_jobs("probe")
def probe_jobs(
    data_dir: str | None = None,
    val_fraction: Annotated[
        float, typer.Option("--val-fraction", help="Share of each class held out for validation (0 <= f < 1).")
    ] = 0.2,
    split_seed: Annotated[
        int, typer.Option("--split-seed", help="Seed of the train/validation split (--seed seeds random weights).")
    ] = 0,
    weight_decay: Annotated[
        float, typer.Option("--weight-decay", help="L2 penalty on the head's weights: decay / 2 x ||W||^2.")
    ] = 1e-4,
) -> list[Job]:
    """A `vitcli run` experiment: the probe on `data_dir` (read relative to the config's folder), once per run; the
    folder is read now, so that one that is no ImageFolder is refused before the model loads."""
    if data_dir is None:
        raise UsageError(
            "probe in a config needs `data-dir = FOLDER`: one subfolder of images per class (the run's images are not "
            "its data)"
        )
    job = ProbeJob(val_fraction, split_seed, weight_decay, Path(data_dir))
    job.image_folder  # noqa: B018  (read now: its refusals come before the model loads)
    return [job]
