"""vitcli as a Python library: load a model once, run any image experiment on it, get pandas, JSON and figures.

Each experiment function takes the command's own options (dashes as underscores: `top_k=3`, `all_heads=True`) and
builds the command's own Jobs (`vitcli.job_registry.job_builder`, the code `vitcli attend ...` and `vitcli run` configs
use), checks them against the loaded model before computing, and publishes the result through the commands'
Publisher into memory instead of the output folder: `to_dict()` is the JSON file the command writes, `to_frame()` its
CSV. Errors are vitcli.errors' typed errors (UsageError for a bad option, VitcliError for a bad image or weights
file), never SystemExit. Every option goes through the command line's own conversion first (the click parameter
Typer built for it, as `vitcli run` configs do), so it is refused with the command's message, and a text is read as
the command line reads it (top_k="3" is 3). Nothing heavy is imported until a function runs.
"""

from __future__ import annotations

import functools
import inspect
import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitcli.errors import UsageError, VitcliError
from vitcli.spec import DEFAULT_MODEL

if TYPE_CHECKING:
    from collections.abc import Callable

    import pandas
    from matplotlib.figure import Figure

    from vitcli.architecture import Architecture
    from vitcli.jobs import Job, Presentation
    from vitcli.model import VitModel

# CSV columns of grid positions and indices: read back as floats when a row leaves them empty (the CLS token's row).
WHOLE_NUMBER_COLUMNS = {"row", "col", "token", "patch", "block", "head", "layer", "rank", "class", "contrast_class"}

__all__ = [
    "Result",
    "ablate",
    "attend",
    "attribute",
    "explain",
    "explore",
    "lens",
    "load_model",
    "occlude_patches",
    "occlude_quadrants",
    "patches",
    "predict",
    "run_experiment",
    "trace",
]  # anatomy, compare, heads, patch and probe: vitcli.api_sets


def load_model(
    name: str = DEFAULT_MODEL,
    weights: str = "pretrained",
    *,
    seed: int = 0,
    checkpoint: str | Path | None = None,
    labels: str | Path | None = None,
    templates: Sequence[str] = (),
    device: str = "auto",
    batch_size: int | None = None,
) -> VitModel:
    """The model the commands' --model, --weights, --seed, --checkpoint, --labels, --template, --device and
    --batch-size options load; one load per process for the same arguments. weights: "pretrained" (the Hugging Face
    cache or hub, or `checkpoint`) or "random" (seeded, untrained). labels: a Path is a file; text is read as
    --labels reads it (a comma-separated list, or a file)."""
    from vitcli.spec import WeightsSpec, check_templates, parse_labels

    if not isinstance(name, str) or not name.strip():
        raise UsageError(f"name must be a timm model name such as {DEFAULT_MODEL!r}, not {name!r}")
    if not isinstance(weights, str) or weights not in ("pretrained", "random"):
        raise UsageError(f"weights must be 'pretrained' or 'random', not {weights!r}")
    if not isinstance(device, str) or device not in ("auto", "cpu", "cuda", "mps"):
        raise UsageError(f"device must be one of auto, cpu, cuda, mps, not {device!r}")
    # --seed, --checkpoint, --labels and --batch-size as the command line converts and bounds them.
    given = {"seed": seed, "checkpoint": checkpoint, "labels": labels, "batch_size": batch_size}
    shared = command_line_options("predict", {key: value for key, value in given.items() if value is not None})
    labels_path, label_names = (labels, None) if isinstance(labels, Path) else parse_labels(shared.get("labels"))
    check_templates(tuple(templates))
    spec = WeightsSpec(
        model_name=name,
        random=weights == "random",
        seed=shared.get("seed", 0),
        checkpoint=shared.get("checkpoint"),
        labels=labels_path,
        label_names=label_names,
        templates=tuple(templates),
    )
    from vitcli.loading import load_model as load

    return load(spec, device, shared.get("batch_size"))


@dataclass
class Result:
    """One experiment's result on one image, as the command would publish it."""

    job: Job
    value: Any  # the experiment's typed result (vitcli.experiments), for code that wants the tensors
    presentation: Presentation
    files: dict[str, Any]  # suffix -> what the command writes: JSON and CSV text, a figure writer, extra files

    @property
    def name(self) -> str:
        """The result's name, the stem of the command's files (e.g. attention-b4-h1-q74)."""
        return self.job.name()

    def to_dict(self) -> dict[str, Any]:
        """The JSON document the command writes: provenance, subject, experiment and result."""
        return json.loads(self.files["json"])

    def to_frame(self) -> pandas.DataFrame:
        """The command's CSV rows as a pandas DataFrame (image and model columns first). Grid positions and indices
        stay whole numbers where some rows have none (the CLS token's `row`): pandas' nullable Int64."""
        import pandas

        frame = pandas.read_csv(io.StringIO(self.files["csv"]))
        for column in WHOLE_NUMBER_COLUMNS.intersection(frame.columns):
            values = frame[column]
            if values.dtype.kind == "f" and values.dropna().apply(float.is_integer).all():
                frame[column] = values.astype("Int64")
        return frame

    def figure(self) -> Figure:
        """The command's figure as a matplotlib Figure (close it with matplotlib.pyplot.close when done)."""
        if self.presentation.figure is None:
            raise VitcliError(f"`{self.job.command}` draws no figure for {self.name}: see to_frame() or to_dict()")
        return self.presentation.figure()

    @property
    def table(self) -> Any:
        """The rich table `--format table` prints, laid out for the width it is printed at (rich.print(result.table)
        shows it)."""
        from vitcli.render import fitted

        return fitted(self.presentation.table)

    def text(self, suffix: str) -> str:
        """A text file of the result by its suffix: "json", "csv", or an extra one ("html" for explore)."""
        content = self.files.get(suffix)
        if not isinstance(content, str):
            raise VitcliError(f"{self.name} has no text file .{suffix} (it has: {', '.join(sorted(self.files))})")
        return content

    def __repr__(self) -> str:
        return f"<vitcli Result {self.name}: to_frame(), to_dict(), figure()>"


def run_experiment(command: str, model: VitModel, image: str | Path | None = None, **options: Any) -> Result:
    """Any registered experiment by its command name (`vitcli run`'s `command`), with the command's options."""
    from vitcli.context import plan_jobs
    from vitcli.job_registry import JOB_MODULES, job_builder, job_commands

    check_model(model)
    if image is not None and not isinstance(image, (str, os.PathLike)):
        raise UsageError(f"image must be the path of an image file (a str or pathlib.Path), not {image!r}")
    if not isinstance(command, str) or command not in JOB_MODULES:
        raise UsageError(f"{command!r} is not an experiment vitcli can run (known: {', '.join(job_commands())})")
    builder = job_builder(command)
    jobs = plan_jobs(architecture_of(model), builder(**command_options(command, builder, options)))
    if len(jobs) != 1:
        raise VitcliError(f"`{command}` made {len(jobs)} experiments from these options; run_experiment runs one")
    (job,) = jobs
    if job.scope == "set":
        function = command.replace("-", "_")
        raise UsageError(f"`{command}` is about several images together: call vitcli.{function}(model, images, ...)")
    return compute_and_publish(job, model, image, call_text(command, image, options))


def check_model(model: Any) -> None:
    from vitcli.model import VitModel

    if isinstance(model, str):
        raise UsageError(f"model must be a loaded model, not the name {model!r}: pass vitcli.load_model({model!r})")
    if not isinstance(model, VitModel):
        raise UsageError(f"model must be a loaded model from vitcli.load_model(...), not {type(model).__name__}")


def command_options(command: str, builder: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The options converted as the command line converts them: a number where text is expected (query=74) becomes
    text, one value where a list is expected a list of one, text where a number is expected is read as the command
    line reads it; True or False where a value is expected, and values outside the option's range or choices, are
    refused with the command's message."""
    parameters = inspect.signature(builder).parameters
    unknown = [key for key in options if key not in parameters]
    if unknown:
        known = ", ".join(sorted(parameters))
        raise UsageError(f"`{command}` has no option {unknown[0]!r} (its options: {known})")
    return command_line_options(command, options)


def command_line_options(command: str, options: dict[str, Any]) -> dict[str, Any]:
    """Each option through the click parameter the command line has for it (the conversion `vitcli run` configs use);
    None, the option's "not given", and options without a parameter pass as they are."""
    from vitcli.batch.config import _convert

    parameters = _command_line_parameters(command)
    converted = {}
    for key, value in options.items():
        if isinstance(value, tuple):
            value = list(value)
        if value is not None and key in parameters:
            value = _convert(parameters[key], value, key)
        converted[key] = value
    return converted


@functools.cache
def _command_line_parameters(command: str) -> dict[str, Any]:
    from vitcli.batch.config import _click_parameters

    return _click_parameters(command)


def architecture_of(model: VitModel) -> Architecture:
    """The loaded model's own facts, for the jobs' checks (a model built in code may differ from its name's)."""
    from vitcli.architecture import architecture_from

    return architecture_from(model.name, model.family, model.num_classes, tuple(model.labels))


class _Memory:
    """Where the Publisher writes for the API: the files are kept, not written."""

    def __init__(self) -> None:
        self.files: dict[str, Any] = {}

    def folder(self, *parts: str) -> Path:
        return Path(*parts)

    def write(self, folder: Path, result: Any, then: Callable[[list[Path]], None] | None = None) -> list[Path]:
        self.files = dict(result.files)
        paths = [folder / f"{result.name}.{suffix}" for suffix in result.files]
        if then is not None:
            then(paths)
        return paths


def compute_and_publish(
    job: Job, model: VitModel, image: str | Path | None, call: str, images: list[Path] | None = None
) -> Result:
    """`job` run by a session on `model` (vitcli.session, as the commands run it), published into memory."""
    from vitcli.output import Emitter, Messages
    from vitcli.publisher import Publisher
    from vitcli.runner import Published, Report
    from vitcli.session import Session

    if job.scope == "image" and image is None:
        raise UsageError(f"`{job.command}` needs an image: pass its path")
    paths = [Path(image)] if job.scope == "image" and image is not None else list(images or [])
    memory = _Memory()
    provenance = {**model.provenance(), "weights_label": model.spec.label, "command": call}
    publisher = Publisher(memory, "memory", Emitter("table", quiet=True), Messages(quiet=True), provenance)  # type: ignore[arg-type]
    publisher.keeps_caches = False
    session = Session(model, publisher, reraise=True)
    published: list[Published] = []
    session.on_published(published.append)
    session.run([job], paths, Report())
    if not published:
        raise VitcliError(f"`{job.command}` computed nothing: it needs images")
    (one,) = published
    assert one.presentation is not None  # the runner publishes every result with its presentation
    return Result(job, one.result, one.presentation, memory.files)


def call_text(command: str, image: str | Path | None, options: dict[str, Any]) -> str:
    arguments = ["model"] + ([repr(str(image))] if image is not None else [])
    arguments += [f"{key}={value!r}" for key, value in options.items()]
    return f"vitcli.{command.replace('-', '_')}({', '.join(arguments)})"


# ----- one function per experiment: the command's options as keyword arguments


def predict(model: VitModel, image: str | Path, **options: Any) -> Result:
    """`vitcli predict`: the top classes. Options: top_k."""
    return run_experiment("predict", model, image, **options)


def patches(model: VitModel, image: str | Path, **options: Any) -> Result:
    """`vitcli patches`: from pixels to the row entering block 1. Options: patch (74, "P74", "r5c3" or a list),
    values."""
    return run_experiment("patches", model, image, **options)


def attend(model: VitModel, image: str | Path, **options: Any) -> Result:
    """`vitcli attend`: exact attention. Options: view, block, head, all_heads, query, head_fusion, discard_ratio,
    top_k."""
    return run_experiment("attend", model, image, **options)


def occlude_quadrants(model: VitModel, image: str | Path, **options: Any) -> Result:
    """`vitcli occlude-quadrants`: the drop when each quadrant is covered. Options: target, fill."""
    return run_experiment("occlude-quadrants", model, image, **options)


def occlude_patches(model: VitModel, image: str | Path, **options: Any) -> Result:
    """`vitcli occlude-patches`: the drop per covered window. Options: target, fill, size, stride."""
    return run_experiment("occlude-patches", model, image, **options)


def trace(model: VitModel, image: str | Path, **options: Any) -> Result:
    """`vitcli trace`: one token's row through the blocks. Options: as `vitcli trace --help` lists them."""
    return run_experiment("trace", model, image, **options)


def lens(model: VitModel, image: str | Path, **options: Any) -> Result:
    """`vitcli lens`: the logit lens after every block. Options: target."""
    return run_experiment("lens", model, image, **options)


def explain(model: VitModel, image: str | Path, **options: Any) -> Result:
    """`vitcli explain`: explanation maps and their audits. Options: as `vitcli explain --help` lists them (method,
    one or a list; target, contrast, faithfulness, sanity, robustness, road, masks, ...)."""
    return run_experiment("explain", model, image, **options)


def explore(model: VitModel, image: str | Path, **options: Any) -> Result:
    """`vitcli explore`: the attention explorer page; `result.text("html")` is the page. Options: blocks, explain."""
    return run_experiment("explore", model, image, **options)


def attribute(model: VitModel, image: str | Path, **options: Any) -> Result:
    """`vitcli attribute`: direct logit attribution. Options: target, contrast, by ("block", "head", "token"),
    block."""
    return run_experiment("attribute", model, image, **options)


def ablate(model: VitModel, image: str | Path, **options: Any) -> Result:
    """`vitcli ablate`: one head or sublayer removed at a time. Options: target, heads, blocks, mode, reference."""
    return run_experiment("ablate", model, image, **options)
