"""The options every command shares (model, output, run control), declared once as typed parameters
(vitcli.declared_options): the command line adds them to each command (vitcli.options); a `vitcli run` config sets
them in its [model] and [output] tables and converts them through the same declarations."""

from __future__ import annotations

import inspect
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from vitcli.spec import DEFAULT_MODEL


class Weights(str, Enum):
    pretrained = "pretrained"
    random = "random"


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"
    mps = "mps"


class Format(str, Enum):
    table = "table"
    json = "json"
    jsonl = "jsonl"
    csv = "csv"


MODEL_PANEL = "Model options"
OUTPUT_PANEL = "Output options"
RUN_PANEL = "Run options"
# A forward of 4,096 images of 224x224 already needs tens of GB; a larger --batch-size is a typo, not a setting.
MAX_BATCH_SIZE = 4096


def _option(*names: str, panel: str, **settings: Any) -> Any:
    return typer.Option(*names, rich_help_panel=panel, **settings)


# (name, annotation, default) of every shared option, in the order --help lists them.
SHARED_OPTIONS: list[tuple[str, Any, Any]] = [
    (
        "model",
        Annotated[
            str,
            _option(
                "--model",
                "-m",
                help="timm ViT name, hf:FOLDER, open_clip:NAME or open_clip:NAME/TAG.",
                panel=MODEL_PANEL,
            ),
        ],
        DEFAULT_MODEL,
    ),
    (
        "checkpoint",
        Annotated[
            Path | None,
            _option("--checkpoint", help="Local weights: .safetensors, or a .pth/.pt state dict.", panel=MODEL_PANEL),
        ],
        None,
    ),
    (
        "labels",
        Annotated[
            str | None,
            _option(
                "--labels",
                metavar="NAMES|FILE",
                help='Class names: a comma-separated list ("dog,cat,car") or a file, one per line (a value naming '
                "a file, ending in .txt or holding a /). On open_clip models: zero-shot classes. Default: "
                "CHECKPOINT.labels.txt or labels.txt beside the checkpoint, else ImageNet's.",
                panel=MODEL_PANEL,
                show_default=False,
            ),
        ],
        None,
    ),
    (
        "labels_file",
        Annotated[
            Path | None,
            _option(
                "--labels-file",
                metavar="FILE",
                help="Class names from a file, one per line (always a file, whatever its name).",
                panel=MODEL_PANEL,
                show_default=False,
            ),
        ],
        None,
    ),
    (
        "template",
        Annotated[
            list[str] | None,
            _option(
                "--template",
                metavar="TEXT",
                help="A prompt template for zero-shot labels and text targets, {} standing for the label "
                '("a photo of a {}."); repeat it to average several (CLIP\'s recipe). Default: the label alone. '
                "Models with a text tower only.",
                panel=MODEL_PANEL,
                show_default=False,
            ),
        ],
        None,
    ),
    (
        "weights",
        Annotated[
            Weights,
            _option(
                "--weights",
                help="pretrained: timm's weights (HF cache or hub); random: untrained, seeded.",
                panel=MODEL_PANEL,
            ),
        ],
        Weights.pretrained,
    ),
    (
        "seed",
        Annotated[
            int | None,
            _option("--seed", help="Seed for --weights random (default: 0).", panel=MODEL_PANEL, show_default=False),
        ],
        None,
    ),
    ("device", Annotated[Device, _option("--device", help="Where the model runs.", panel=MODEL_PANEL)], Device.auto),
    (
        "batch_size",
        Annotated[
            int | None,
            _option(
                "--batch-size",
                min=1,
                max=MAX_BATCH_SIZE,
                help="Images per forward pass (default: 8 on a CPU, 64 on a GPU).",
                show_default=False,
                panel=MODEL_PANEL,
            ),
        ],
        None,
    ),
    (
        # Text, not Path: Typer turns '' into Path('.'), and an empty --output-dir must be refused, not mean here.
        "output_dir",
        Annotated[
            str | None,
            _option(
                "--output-dir",
                "-o",
                metavar="DIR",
                help="Folder for files: DIR/MODEL/IMAGE-HASH/RESULT.* (default: outputs).",
                panel=OUTPUT_PANEL,
                show_default=False,
            ),
        ],
        None,
    ),
    (
        "format",
        Annotated[
            Format,
            _option(
                "--format",
                "-f",
                help="What stdout carries; jsonl and csv stream one result at a time.",
                panel=OUTPUT_PANEL,
            ),
        ],
        Format.table,
    ),
    (
        "quiet",
        Annotated[
            bool,
            _option(
                "--quiet",
                "-q",
                help="No table, messages or library warnings; files are still written.",
                panel=OUTPUT_PANEL,
            ),
        ],
        False,
    ),
    (
        "figures",
        Annotated[
            bool,
            _option(
                "--figures/--no-figures",
                help="Draw each result's PNG figure; --no-figures writes JSON and CSV only (over thousands of "
                "images: a figure costs about 0.1 s, several times a batched prediction).",
                panel=OUTPUT_PANEL,
            ),
        ],
        True,
    ),
    ("debug", Annotated[bool, _option("--debug", help="Show tracebacks on errors.", panel=OUTPUT_PANEL)], False),
    (
        "fail_fast",
        Annotated[bool, _option("--fail-fast", help="Stop at the first image that fails.", panel=RUN_PANEL)],
        False,
    ),
    (
        "shard",
        Annotated[
            str | None,
            _option(
                "--shard",
                metavar="K/N",
                help="Take the K-th of N shares of the sorted images (1 <= K <= N).",
                panel=RUN_PANEL,
                show_default=False,
            ),
        ],
        None,
    ),
]
SHARED_NAMES = [name for name, _, _ in SHARED_OPTIONS]


def shared_parameters(names: list[str] | tuple[str, ...] = tuple(SHARED_NAMES)) -> list[inspect.Parameter]:
    """The shared options named, as keyword-only parameters in --help order."""
    return [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
        for name, annotation, default in SHARED_OPTIONS
        if name in names
    ]
