"""The Typer app, the options every command shares, and how errors reach people.

Nothing here imports torch or timm: `vitcli --help` stays fast. A command gets a `CommandContext` holding the
shared options, asks it for the model (loaded once per process) and hands its results to `context.output`.
"""

from __future__ import annotations

import functools
import inspect
import shlex
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from vitcli.errors import UsageError, VitcliError
from vitcli.output import Output, OutputOptions
from vitcli.spec import DEFAULT_MODEL, WeightsSpec

if TYPE_CHECKING:
    from vitcli.model import VitModel

app = typer.Typer(
    name="vitcli",
    help="Follow one photograph through a Vision Transformer, with measured numbers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from vitcli import __version__

        typer.echo(f"vitcli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Follow one photograph through a Vision Transformer, with measured numbers.

    Patches are P1..P196 row by row (the patch number is the token index; CLS is token 0); grid rows and
    columns are zero-based; blocks and heads count from one.
    """


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
    csv = "csv"


# The image argument of every command that reads images.
ImagesArgument = Annotated[
    Optional[list[str]],
    typer.Argument(metavar="IMAGE", help="Image files, folders or globs (default: a sample photo).", show_default=False),
]

_MODEL = "Model options"
_OUTPUT = "Output options"

# (name, annotation, default) of every shared option, in the order --help lists them.
SHARED_OPTIONS: list[tuple[str, Any, Any]] = [
    ("model", Annotated[str, typer.Option("--model", "-m", help="timm ViT name.", rich_help_panel=_MODEL)], DEFAULT_MODEL),
    (
        "checkpoint",
        Annotated[
            Optional[Path],
            typer.Option(help="Local weights: .safetensors, or a .pth/.pt state dict.", rich_help_panel=_MODEL),
        ],
        None,
    ),
    (
        "weights",
        Annotated[
            Weights,
            typer.Option(help="pretrained: timm's weights (HF cache or hub); random: untrained, seeded.", rich_help_panel=_MODEL),
        ],
        Weights.pretrained,
    ),
    ("seed", Annotated[int, typer.Option(help="Seed for --weights random.", rich_help_panel=_MODEL)], 0),
    ("device", Annotated[Device, typer.Option(help="Where the model runs.", rich_help_panel=_MODEL)], Device.auto),
    (
        "batch_size",
        Annotated[
            Optional[int],
            typer.Option(
                min=1, help="Images per forward pass (default: 8 on a CPU, 64 on a GPU).", show_default=False, rich_help_panel=_MODEL
            ),
        ],
        None,
    ),
    (
        "output_dir",
        Annotated[
            Optional[Path],
            typer.Option("--output-dir", "-o", help="Folder for files (default: outputs/COMMAND/IMAGE-STEM).", rich_help_panel=_OUTPUT),
        ],
        None,
    ),
    (
        "format",
        Annotated[Format, typer.Option("--format", "-f", help="What stdout carries.", rich_help_panel=_OUTPUT)],
        Format.table,
    ),
    (
        "quiet",
        Annotated[bool, typer.Option("--quiet", "-q", help="No table and no messages; files are still written.", rich_help_panel=_OUTPUT)],
        False,
    ),
    ("debug", Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.", rich_help_panel=_OUTPUT)], False),
]
_SHARED_NAMES = [name for name, _, _ in SHARED_OPTIONS]


@dataclass
class CommandContext:
    """The shared options of one command run and the services built from them."""

    command: str
    weights: WeightsSpec
    device: str
    batch_size: int | None
    output: Output

    def model(self) -> VitModel:
        from vitcli.loading import load_model

        return load_model(self.weights, self.device, self.batch_size)

    def images(self, arguments: list[str] | None) -> list[Path]:
        """The images a command runs on: its arguments expanded, or the sample photo when there are none."""
        from vitcli.images import resolve_images, sample_photo

        if arguments:
            return resolve_images(arguments)
        photo = sample_photo()
        self.output.message(f"no image given: using the sample photo {photo}")
        return [photo]

    @property
    def command_line(self) -> str:
        return shlex.join(["vitcli", *sys.argv[1:]])

    def provenance(self, model: VitModel) -> dict[str, Any]:
        return {**model.provenance(), "command": self.command_line}

    def image_directories(self, paths: list[Path]) -> list[Path]:
        """One output folder per image: outputs/COMMAND/STEM by default, or --output-dir (STEM below it for several)."""
        stems = _unique_stems(paths)
        chosen = self.output.options.output_dir
        if chosen is not None and len(paths) == 1:
            return [self.output.make_directory(chosen)]
        base = chosen or Path("outputs") / self.command
        return [self.output.make_directory(base / stem) for stem in stems]


def _unique_stems(paths: list[Path]) -> list[str]:
    seen: dict[str, int] = {}
    stems = []
    for path in paths:
        count = seen.get(path.stem, 0) + 1
        seen[path.stem] = count
        stems.append(path.stem if count == 1 else f"{path.stem}-{count}")
    return stems


def vitcli_command(name: str, **command_settings: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a command that takes a CommandContext first; the shared options are added to its signature."""

    def register(function: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(function, eval_str=True)
        own = list(signature.parameters.values())[1:]
        shared = [
            inspect.Parameter(option, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
            for option, annotation, default in SHARED_OPTIONS
        ]

        @functools.wraps(function)
        def command(**arguments: Any) -> None:
            shared_values = {option: arguments.pop(option) for option in _SHARED_NAMES}
            debug = shared_values["debug"]
            try:
                context = _context(name, **shared_values)
                function(context, **arguments)
            except VitcliError as error:
                if debug:
                    traceback.print_exc()
                _fail(str(error), error.exit_code)
            except KeyboardInterrupt:
                _fail("interrupted", 130)
            except Exception as error:
                if debug:
                    raise
                _fail(f"unexpected {type(error).__name__}: {error} (run again with --debug for the traceback)", 1)

        command.__signature__ = signature.replace(parameters=own + shared)  # type: ignore[attr-defined]
        command.__annotations__ = {parameter.name: parameter.annotation for parameter in own + shared}
        app.command(name, **command_settings)(command)
        return function

    return register


def _context(
    command: str,
    *,
    model: str,
    checkpoint: Path | None,
    weights: Weights,
    seed: int,
    device: Device,
    batch_size: int | None,
    output_dir: Path | None,
    format: Format,
    quiet: bool,
    debug: bool,
) -> CommandContext:
    if checkpoint is not None and weights is Weights.random:
        raise UsageError("--checkpoint and --weights random contradict each other: choose one source of weights")
    spec = WeightsSpec(model_name=model, random=weights is Weights.random, seed=seed, checkpoint=checkpoint)
    output = Output(OutputOptions(format=format.value, quiet=quiet, output_dir=output_dir, debug=debug))
    return CommandContext(command, spec, device.value, batch_size, output)


def _fail(message: str, exit_code: int) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(exit_code)


def run() -> None:
    """The console script: parse errors become one line too (exit 2), like the commands' own errors."""
    try:
        status = app(standalone_mode=False)
    except typer.TyperException as error:
        context = getattr(error, "ctx", None)
        hint = f" (see '{context.command_path} --help')" if context is not None else ""
        typer.echo(f"error: {error.format_message()}{hint}", err=True)
        sys.exit(getattr(error, "exit_code", 1))
    except typer.Exit as exit_:
        sys.exit(exit_.exit_code)
    except typer.Abort:
        typer.echo("error: aborted", err=True)
        sys.exit(130)
    # Without standalone mode a typer.Exit raised inside a command comes back as its code.
    sys.exit(status if isinstance(status, int) else 0)
