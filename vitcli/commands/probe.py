"""`vitcli probe`: the Typer command and its options; it computes over the data folder itself, with the Job of
vitcli.jobs.probe, and keeps the features and the checkpoint in the output store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from vitcli.context import CommandContext
from vitcli.filenames import escaped_path
from vitcli.jobs.probe import ProbeJob
from vitcli.naming import image_subject
from vitcli.shell import vitcli_command

# Features live beside the results of the same weights (the model folder names them), under this subject, in a file
# named by the parameters' SHA-256 too: other weights never read them.
CACHE_SUBJECT = "probe-features"


@vitcli_command(
    "probe",
    examples=[
        "vitcli probe pets/   # pets/dog/*.jpg, pets/cat/*.jpg",
        "vitcli probe pets/ --val-fraction 0.3 --split-seed 1 --weight-decay 1e-3",
    ],
)
def probe_command(
    context: CommandContext,
    data_dir: Annotated[
        Path,
        typer.Argument(metavar="DATA_DIR", help="An ImageFolder: one subfolder of images per class (dog/, cat/)."),
    ],
    val_fraction: Annotated[
        float, typer.Option("--val-fraction", help="Share of each class held out for validation (0 <= f < 1).")
    ] = 0.2,
    split_seed: Annotated[
        int, typer.Option("--split-seed", help="Seed of the train/validation split (--seed seeds random weights).")
    ] = 0,
    weight_decay: Annotated[
        float, typer.Option("--weight-decay", help="L2 penalty on the head's weights: decay / 2 x ||W||^2.")
    ] = 1e-4,
) -> None:
    """A linear probe: new classes on the frozen model's features (logistic regression), with a checkpoint that
    `--checkpoint` loads with the new class names."""
    from vitcli.experiments.probe import adapted_checkpoint, read_image_folder, run_probe
    from vitcli.runner import progress_display

    job = ProbeJob(val_fraction, split_seed, weight_decay)
    context.check([job])
    folder = read_image_folder(data_dir)
    model = context.model()
    provenance = context.provenance(model)
    publisher = context.publisher(provenance)
    cache_folder = publisher.folder(CACHE_SUBJECT)
    cache_name = f"features-{model.parameter_sha256[:16]}"
    cached = _read_cache(publisher.store, cache_folder, cache_name)
    with progress_display(context.show_progress(len(folder.paths))) as progress:
        task = progress.add_task("features", total=len(folder.paths)) if progress is not None else None

        def on_progress(done: int, total: int) -> None:
            if progress is not None:
                progress.update(task, completed=done, total=total)

        result, new = run_probe(model, folder, cached, val_fraction, split_seed, weight_decay, on_progress)
    if new:
        _write_cache(publisher.store, cache_folder, cache_name, {**cached, **new}, model.name)
    subject = f"data-{image_subject(data_dir)}"
    classes = list(result.classes)
    from vitcli.tower_names import is_tower  # torch: not at --help time

    if is_tower(model.name):  # their --checkpoint loads no classifier head (hf: refuses it, open_clip: no head)
        context.messages.info(
            f"no checkpoint written: --checkpoint cannot give {model.name} a classifier head (timm models only)"
        )
    else:
        state, classes = adapted_checkpoint(model, result)
        record = {
            "kind": "linear probe",
            "backbone": model.backbone_record(),
            "probe": {**job.settings(), "data": str(data_dir), "classes": classes, "images": len(folder.paths)},
        }
        written = _write_checkpoint(publisher, subject, f"{job.name()}-checkpoint", state, classes, job, record)
        context.messages.info(
            f"wrote {written[0]} and its class names {written[1]}; use it with "
            f"`vitcli predict IMAGE --model {model.name} --checkpoint {written[0]}`"
        )
    subject_json = {"path": escaped_path(data_dir), "classes": classes, "images": len(folder.paths)}
    context.publish([(job, result, subject, subject_json)], provenance)


def _read_cache(store: Any, folder: Path, name: str) -> dict[str, Any]:
    """Features of earlier runs with these weights; only a cache the store's index vouches for is read."""
    from safetensors.torch import load_file

    if not store.is_complete(folder, name):
        return {}
    return dict(load_file(str(folder / f"{name}.safetensors")))


def _write_cache(store: Any, folder: Path, name: str, features: dict[str, Any], model_name: str) -> None:
    from safetensors.torch import save

    from vitcli.store import ResultFiles

    data = save({digest: feature.contiguous() for digest, feature in features.items()})
    record = {"command": "probe", "contents": f"{model_name} head-input features by image SHA-256"}
    store.write(folder, ResultFiles(name, {"safetensors": data}, record))


def _write_checkpoint(
    publisher: Any,
    subject: str,
    name: str,
    state: dict[str, Any],
    classes: list[str],
    job: ProbeJob,
    record: dict[str, Any],
) -> list[Path]:
    """NAME.safetensors (with `record` as JSON in its metadata, which the loader reads back) and NAME.labels.txt,
    the names the loader looks for beside a checkpoint."""
    import json

    from safetensors.torch import save

    from vitcli.store import ResultFiles
    from vitcli.weights import RECORD_KEY

    metadata = {"format": "pt", RECORD_KEY: json.dumps(record, sort_keys=True)}
    files = {"safetensors": save(state, metadata=metadata), "labels.txt": "\n".join(classes) + "\n"}
    index_entry = {"command": job.command, "settings": job.settings(), "contents": "adapted checkpoint and class names"}
    return publisher.store.write(publisher.folder(subject), ResultFiles(name, files, index_entry))
