"""A `vitcli run` config: TOML read with tomllib, every key checked before the model loads.

    name = "lecture"                      # the run's folder under the output dir (default: the file's stem)
    images = ["../examples/images"]       # files, folders, globs; relative to the config file
    target = "Newfoundland"               # optional: every experiment with a --target option follows it
    [model]                               # the shared model options: name, checkpoint, labels, weights, seed,
    name = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"   # device, batch-size (paths relative to the config)
    [output]
    dir = "outputs"
    [[experiments]]                       # one table per experiment: `command` and that command's own options,
    command = "attend"                    # spelled as on the command line (`top-k` or `top_k`)
    block = 4

Experiment options are converted by click parameters built from the same declarations as the command line's (the
builder's typed parameters, vitcli.declared_options), so a value the command would refuse is refused here, with its
key path: "experiments[2].block: ...". Experiments count from 0.
"""

from __future__ import annotations

import datetime
import hashlib
import inspect
import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitcli.declared_options import click_command, declared_options, reword_bad_value
from vitcli.errors import UsageError
from vitcli.job_registry import JOB_MODULES, job_builder, job_commands
from vitcli.jobs import Job
from vitcli.shared_options import SHARED_NAMES, shared_parameters

TOP_LEVEL_KEYS = ("name", "images", "target", "model", "output", "experiments")
MODEL_KEYS = {
    "name": "model",
    "checkpoint": "checkpoint",
    "labels": "labels",
    "labels_file": "labels_file",
    "template": "template",
    "templates": "template",
    "weights": "weights",
    "seed": "seed",
    "device": "device",
    "batch_size": "batch_size",
}
# Experiment options naming files or folders (globs for reference): read relative to the config file, like `images`.
# `corrupt` (patch's one CORRUPT image) and `clean` (with `corrupt`, the command line's pair) have no command-line
# option: there they are the two arguments. `data_dir` is probe's DATA_DIR argument.
PATH_OPTIONS = ("masks", "reference", "clean", "corrupt", "target_image", "target_direction", "texts", "data_dir")
_OWNER_CONTEXT: dict[int, Any] = {}  # parameter -> a context of its command, which conversion needs
_OPTION_IN_MESSAGE = re.compile(r"--([a-z][a-z0-9-]*)")


@dataclass
class Experiment:
    index: int
    command: str
    options: dict[str, Any]  # the command's own options after conversion (Python names)
    jobs: list[Job] = field(default_factory=list)

    @property
    def path(self) -> str:
        return f"experiments[{self.index}]"


@dataclass
class RunConfig:
    path: Path
    name: str
    images: list[str]  # absolute, resolved against the config's folder
    model_options: dict[str, Any]  # shared option names -> values, as the command line would give them
    output_dir: str | None
    figures: bool | None  # [output] figures; None when the config does not say
    target: str | None
    experiments: list[Experiment]
    text: str  # the file as read, for the manifest

    def as_run(self, overrides: dict[str, Any], images: list[str]) -> dict[str, Any]:
        """The config after command-line overrides, as the manifest records it."""
        return {
            "path": str(self.path),
            "name": self.name,
            "images": images,
            "target": self.target,
            "model": {**_plain(self.model_options_under(overrides)), **_plain(_only(overrides, MODEL_KEYS.values()))},
            "output_dir": str(overrides.get("output_dir", self.output_dir)),
            "figures": overrides.get("figures", True if self.figures is None else self.figures),
            "experiments": [{"command": item.command, **_plain(item.options)} for item in self.experiments],
        }

    def model_options_under(self, overrides: dict[str, Any]) -> dict[str, Any]:
        """The config's model options, less those a typed option replaces: `--weights random` replaces the config's
        checkpoint and `--checkpoint` its `weights = "random"`, since each names the source of the weights."""
        options = dict(self.model_options)
        if str(getattr(overrides.get("weights"), "value", overrides.get("weights"))) == "random":
            options.pop("checkpoint", None)
        if overrides.get("checkpoint") is not None and "weights" not in overrides:
            options.pop("weights", None)
        return options

    def identity(self, model_identity: dict[str, Any]) -> str:
        """What makes two runs mergeable: the same experiments on the same model and weights."""
        experiments = [{"command": item.command, **_plain(item.options)} for item in self.experiments]
        text = json.dumps({"experiments": experiments, "model": model_identity}, sort_keys=True)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


def load_config(path: Path) -> RunConfig:
    if not path.is_file():
        raise UsageError(f"config {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(f"config {path} is not UTF-8 text (TOML files are UTF-8); save it as UTF-8") from error
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"config {path} is not valid TOML: {error}") from error
    except RecursionError as error:  # tomllib parses nested arrays and inline tables by recursion
        raise UsageError(
            f"config {path} is not valid TOML: values nested too deeply (arrays or inline tables inside each other, "
            "deeper than the parser can follow)"
        ) from error
    _known(data, TOP_LEVEL_KEYS, "")
    base = path.resolve().parent
    images = data.get("images", [])
    if isinstance(images, str):
        images = [images]
    if not isinstance(images, list) or not all(isinstance(item, str) for item in images):
        raise UsageError("images: must be a list of paths, folders or globs (strings)")
    model = _table(data, "model")
    _known(model, tuple(MODEL_KEYS), "model.", normalize=True)
    _one_spelling(model, "model")
    if "template" in model and "templates" in model:
        raise UsageError("model: `template` and `templates` are the same option: give it once")
    model_options = {MODEL_KEYS[_python_name(key)]: value for key, value in model.items()}
    for key in ("checkpoint", "labels_file"):
        if key in model_options:
            model_options[key] = str(base / _string(model_options[key], f"model.{key}"))
    if "labels" in model_options:
        model_options["labels"] = _labels(model_options["labels"], base)
    shared = _parameters_declared(shared_parameters())
    model_options = {key: _convert(shared[key], value, f"model.{key}") for key, value in model_options.items()}
    output = _table(data, "output")
    _known(output, ("dir", "figures"), "output.")
    if not isinstance(output.get("figures", True), bool):
        raise UsageError("output.figures: must be true or false")
    target = data.get("target")
    if target is not None and not isinstance(target, (str, int)):
        raise UsageError("target: must be a class index or a label (a number or a string)")
    experiments_data = data.get("experiments")
    if not isinstance(experiments_data, list) or not experiments_data:
        raise UsageError("experiments: the config declares no [[experiments]] tables")
    experiments = [
        _experiment(index, table, None if target is None else str(target), base)
        for index, table in enumerate(experiments_data)
    ]
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not name.strip():
        raise UsageError("name: must be a non-empty string")
    return RunConfig(
        path=path,
        name=name,
        images=[os.path.normpath(base / image) for image in images],
        model_options=model_options,
        output_dir=None if "dir" not in output else str(base / _folder(output["dir"], "output.dir")),
        figures=output.get("figures"),
        target=None if target is None else str(target),
        experiments=experiments,
        text=text,
    )


def _experiment(index: int, table: Any, target: str | None, base: Path) -> Experiment:
    where = f"experiments[{index}]"
    if not isinstance(table, dict):
        raise UsageError(f"{where}: must be a table with a `command` key")
    command = table.get("command")
    if not isinstance(command, str) or command not in JOB_MODULES:
        known = ", ".join(job_commands())
        raise UsageError(f"{where}.command: {command!r} is not an experiment vitcli can run (known: {known})")
    builder = job_builder(command)
    accepted = inspect.signature(builder).parameters
    parameters = _click_parameters(command)
    options: dict[str, Any] = {}
    _one_spelling(table, where)
    for key, value in table.items():
        if key == "command":
            continue
        name = _python_name(key)
        if name in SHARED_NAMES:
            raise UsageError(
                f"{where}.{key}: model and output options belong in [model] and [output], not in an experiment"
            )
        if name not in accepted or (name not in parameters and name not in PATH_OPTIONS):
            known = ", ".join(sorted(option.replace("_", "-") for option in accepted))
            raise UsageError(f"{where}.{key}: `{command}` has no such option (its options: {known})")
        if name in PATH_OPTIONS:
            value = os.path.normpath(base / _string(value, f"{where}.{key}"))
        options[name] = _convert(parameters[name], value, f"{where}.{key}") if name in parameters else value
    # An experiment that follows an embedding target (vitcli.targets) does not take the config's class as well.
    follows_embedding = any(
        name in options for name in ("target_image", "target_direction", "target_feature", "target_text")
    )
    if target is not None and "target" in accepted and "target" not in options and not follows_embedding:
        options["target"] = target
    experiment = Experiment(index, command, options)
    try:
        experiment.jobs = builder(**options)
    except UsageError as error:
        raise UsageError(located(where, str(error))) from error
    return experiment


def located(where: str, message: str) -> str:
    """A command's usage message with the config key it came from: `experiments[2].block: --block 13 ...`."""
    option = _OPTION_IN_MESSAGE.search(message)
    return f"{where}.{_python_name(option.group(1)).replace('_', '-')}: {message}" if option else f"{where}: {message}"


def _click_parameters(command: str) -> dict[str, Any]:
    """The command's options, its own and the shared ones, as click parameters built as the command line builds them:
    from the declarations of its builder's parameters and of the shared options."""
    return _parameters_declared(declared_options(job_builder(command)) + shared_parameters())


def _parameters_declared(declared: list[inspect.Parameter]) -> dict[str, Any]:
    """The click parameters made of these declarations (vitcli.declared_options), each with its command's context."""
    click_options = click_command(declared)
    context = click_options.context_class(click_options)
    for parameter in click_options.params:
        _OWNER_CONTEXT[id(parameter)] = context
    return {parameter.name: parameter for parameter in click_options.params}


def _convert(parameter: Any, value: Any, where: str) -> Any:
    """A TOML value through the option's own command-line conversion: the same types, ranges and choices."""
    if isinstance(value, (dict, datetime.date, datetime.time)):
        raise UsageError(f"{where}: {value!r} is not a value this option takes")
    if getattr(parameter, "is_flag", False) and not isinstance(value, bool):
        raise UsageError(f"{where}: {value!r} is not true or false")
    if not getattr(parameter, "is_flag", False) and isinstance(value, bool):
        raise UsageError(f"{where}: {value!r} is not a value this option takes (true/false is for flags)")
    if isinstance(value, float) and value.is_integer() is False and "int" in str(parameter.type_descriptor.annotation):
        raise UsageError(f"{where}: {value!r} is not an integer")
    if parameter.multiple and not isinstance(value, list):
        value = [value]
    if isinstance(value, list):
        value = [str(item) if isinstance(item, (int, float)) else item for item in value]
    owner = _OWNER_CONTEXT.get(id(parameter))
    try:
        converted = parameter.process_value(owner, value)
    except Exception as error:  # the command line's own BadParameter, whichever click Typer bundles
        import typer

        if isinstance(error, typer.BadParameter):
            reword_bad_value(error)
        message = error.format_message() if hasattr(error, "format_message") else str(error)
        raise UsageError(f"{where}: {message}") from error
    return list(converted) if isinstance(converted, tuple) else converted


def _known(table: dict[str, Any], keys: tuple[str, ...], prefix: str, normalize: bool = False) -> None:
    for key in table:
        name = _python_name(key) if normalize else key
        if name not in keys:
            raise UsageError(f"{prefix}{key}: unknown key (known: {', '.join(keys)})")


def _labels(value: Any, base: Path) -> str:
    """model.labels as --labels reads it: a file (relative to the config) or comma-separated names; a TOML list of
    names is the same list."""
    if isinstance(value, list):
        if not value or not all(isinstance(item, str) and item.strip() and "," not in item for item in value):
            raise UsageError("model.labels: a list must hold label names, none empty and none with a comma")
        return ",".join(value)
    text = _string(value, "model.labels")
    if (base / text).is_file() or text.lower().endswith(".txt") or "/" in text or os.sep in text:
        return str(base / text)
    return text


def _one_spelling(table: dict[str, Any], where: str) -> None:
    """`top-k` and `top_k` name one option: both in one table would silently keep the last, so both are refused."""
    spellings: dict[str, str] = {}
    for key in table:
        first = spellings.setdefault(_python_name(key), key)
        if first != key:
            raise UsageError(f"{where}: `{first}` and `{key}` are the same option: give it once")


def _table(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise UsageError(f"{key}: must be a table ([{key}])")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise UsageError(f"{where}: must be a string")
    return value


def _folder(value: Any, where: str) -> str:
    """A folder name: empty text is refused, as `-o ''` is (it would silently mean the config's own folder)."""
    if not _string(value, where).strip():
        raise UsageError(f"{where}: is empty: give a folder name (relative to the config file), or leave the key out")
    return value


def _python_name(key: str) -> str:
    return key.replace("-", "_")


def _only(options: dict[str, Any], names: Any) -> dict[str, Any]:
    return {key: value for key, value in options.items() if key in set(names)}


def _plain(options: dict[str, Any]) -> dict[str, Any]:
    """Option values as JSON: enums by value, paths as text."""
    plain = {}
    for key, value in options.items():
        if hasattr(value, "value"):
            value = value.value
        elif isinstance(value, Path):
            value = str(value)
        plain[key.replace("_", "-")] = value
    return plain
