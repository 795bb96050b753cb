"""A `vitcli run` config as data: its experiments with their Jobs, what the manifest records of it and the identity
that makes runs mergeable. Apart from vitcli.batch.config (which reads TOML and converts options through the command
line's click parameters), so that a command that runs through the batch engine (`vitcli bench`) builds one without
importing the command line."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitcli.jobs import Job

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


def located(where: str, message: str) -> str:
    """A command's usage message with the config key it came from: `experiments[2].block: --block 13 ...`."""
    option = _OPTION_IN_MESSAGE.search(message)
    return f"{where}.{_python_name(option.group(1)).replace('_', '-')}: {message}" if option else f"{where}: {message}"


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
