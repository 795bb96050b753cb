"""The Typer app, how a command gets the shared options, and how errors reach people.

Nothing here imports torch or timm: `vitcli --help` stays fast. A command function takes a `CommandContext` first;
`vitcli_command` adds the shared options (vitcli.options) to its signature and turns every failure into one line
on stderr: exit 2 for usage errors (checked before the model loads), 1 for failures, 130 on Ctrl-C, 143 on SIGTERM,
141 when stdout is a closed pipe. `--debug` shows the traceback.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import os
import re
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import typer

from vitcli import collector, interrupts
from vitcli.context import DEFAULT_OUTPUT, CommandContext, Shard
from vitcli.declared_options import reword_bad_value
from vitcli.errors import AlreadyReported, UsageError, VitcliError
from vitcli.options import ImagesArgument, command_parameters
from vitcli.shared_options import SHARED_NAMES, SHARED_OPTIONS, Weights
from vitcli.spec import WeightsSpec, check_templates, parse_labels
from vitcli.store import check_output_dir


class _HelpWithoutPythonTypes:
    """Help shows on/off options as bare flags, Typer's own (--help, --install-completion) included, a repeatable
    option with the type of one value, and arguments that take many values (IMAGE...) without a type. Otherwise Typer
    prints `--quiet <bool>` as if the flag took a value, and `--patch <list[str]>` or `<list[str]>` beside IMAGE.
    A value the option refuses reads as plain words (reword_bad_value)."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)  # type: ignore[misc]
        except typer.BadParameter as error:
            reword_bad_value(error)
            raise

    def get_params(self, ctx: typer.Context) -> list[Any]:
        params = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
            elif isinstance(param, typer.core.TyperOption) and param.multiple and param.metavar is None:
                param.metavar = re.sub(r"^<list\[(.*)\]>$", r"<\1>", param.display_type(ctx))
            elif isinstance(param, typer.core.TyperArgument) and param.nargs != 1:
                param.display_type_rich = _no_type
        return params


def _no_type(ctx: typer.Context) -> None:
    return None


class _Group(_HelpWithoutPythonTypes, typer.core.TyperGroup):
    pass


class _Command(_HelpWithoutPythonTypes, typer.core.TyperCommand):
    pass


app = typer.Typer(
    name="vitcli",
    cls=_Group,
    help="Follow one photograph through a Vision Transformer, with measured numbers.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)

__all__ = ["CommandContext", "ImagesArgument", "app", "run", "vitcli_command"]

_PARSE_CONTEXT = "parse_context"
# How `vitcli --help` groups the commands.
COMMAND_PANELS = {
    **dict.fromkeys(
        ("predict", "patches", "attend", "occlude-quadrants", "occlude-patches", "compare-patch-size"),
        "One photo through the model (the lecture's steps)",
    ),
    **dict.fromkeys(
        ("trace", "compare", "lens", "explain", "probe", "explore"), "Deeper: traces, comparisons, explanations"
    ),
    **dict.fromkeys(("anatomy",), "Deeper: traces, comparisons, explanations"),
    **dict.fromkeys(("attribute", "ablate", "patch"), "Causal: what blocks, heads and tokens contribute"),
    **dict.fromkeys(("run", "merge", "report", "scenes"), "Many images and experiments"),
}
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
EXIT_BROKEN_PIPE = 141


def _version(value: bool) -> None:
    if value:
        from vitcli import __version__

        typer.echo(f"vitcli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Follow one photograph through a Vision Transformer, with measured numbers.

    Patches are P1..P196 row by row (the patch number is the token index; CLS is token 0); grid rows and
    columns are zero-based; blocks and heads count from one.
    """


def vitcli_command(
    name: str,
    examples: Sequence[str] = (),
    options: Sequence[str] | None = None,
    reads_config: bool = False,
    builder: Callable[..., Any] | None = None,
    **command_settings: Any,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a command that takes a CommandContext first; the shared options (all, or the names in `options`
    for commands that load no model) are added to its signature and `examples` (command lines) end its --help.
    `builder`: the command's job builder, whose declared options replace the function's `**options` (vitcli.options).
    `reads_config`: the command completes the shared options from a config and builds its own context from them."""

    def register(function: Callable[..., Any]) -> Callable[..., Any]:
        taken = SHARED_NAMES if options is None else list(options)
        parameters = command_parameters(function, builder, taken, _PARSE_CONTEXT)

        @functools.wraps(function)
        def command(**arguments: Any) -> None:
            parse_context = arguments.pop(_PARSE_CONTEXT)
            shared_values = {
                option: arguments.pop(option) if option in taken else default for option, _, default in SHARED_OPTIONS
            }
            with errors_for_people(shared_values["debug"]):
                context = build_context(name, **shared_values, seed_name=None if reads_config else "--seed")
                context.explicit_options = _given_on_the_command_line(parse_context, shared_values)
                context.option_values = shared_values
                function(context, **arguments)

        command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        command.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
        command_settings.setdefault("rich_help_panel", COMMAND_PANELS.get(name))
        # The command list shows the docstring's first paragraph; rich mode would keep its line breaks.
        summary = inspect.cleandoc(function.__doc__ or "").split("\n\n")[0]
        command_settings.setdefault("short_help", " ".join(summary.split()))
        if examples:
            command_settings.setdefault(
                "epilog", "[b]Examples[/b]\n\n" + "\n\n".join(f"  $ {line}" for line in examples)
            )
        app.command(name, cls=_Command, **command_settings)(command)
        return function

    return register


class errors_for_people:  # noqa: N801  (used as a `with` statement, reads like one)
    """Turn any failure inside into one line on stderr and the documented exit code."""

    def __init__(self, debug: bool):
        self.debug = debug

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, error: BaseException | None, _traceback: Any) -> bool:
        if error is None or isinstance(error, (typer.Exit, SystemExit)):
            return False
        if isinstance(error, BrokenPipeError):
            _silence_stdout()
            raise typer.Exit(EXIT_BROKEN_PIPE)
        if self.debug and not isinstance(error, (KeyboardInterrupt, interrupts.Terminated)):
            traceback.print_exception(error)
        if isinstance(error, KeyboardInterrupt):
            _fail("interrupted", EXIT_INTERRUPTED)
        if isinstance(error, interrupts.Terminated):
            _fail("terminated", EXIT_TERMINATED)
        if isinstance(error, AlreadyReported):
            raise typer.Exit(error.exit_code)
        if isinstance(error, VitcliError):
            _fail(str(error), error.exit_code)
        if isinstance(error, MemoryError):
            _fail("out of memory: try a smaller --batch-size or fewer images per run", 1)
        if "torchvision::" in str(error):
            _fail(mismatched_torch_message(error), 1)
        _fail(f"internal error ({type(error).__name__}): {error}; please report it (run again with --debug)", 1)
        return False


def mismatched_torch_message(error: BaseException) -> str:
    """torchvision built for another torch fails on import (timm imports it) with "operator torchvision::nms does not
    exist": name both installed versions and the fix."""
    from importlib.metadata import PackageNotFoundError, version

    installed = {}
    for package in ("torch", "torchvision"):
        try:
            installed[package] = version(package)
        except PackageNotFoundError:
            installed[package] = "(not installed)"
    first_line = str(error).strip().splitlines()[0]
    return (
        f"torch {installed['torch']} and torchvision {installed['torchvision']} do not match ({first_line}): "
        "install a matching pair in one pip call from one index, e.g. `pip install torch==2.14.1 "
        "torchvision==0.29.1` (see the README's install section)"
    )


def build_context(
    command: str,
    *,
    model: str,
    checkpoint: Path | None,
    labels: str | None,
    labels_file: Path | None,
    template: list[str] | None,
    weights: Weights,
    seed: int | None,
    device: Any,
    batch_size: int | None,
    output_dir: str | None,
    format: Any,
    quiet: bool,
    figures: bool,
    debug: bool,
    fail_fast: bool,
    shard: str | None,
    seed_name: str | None = "--seed",
) -> CommandContext:
    """The shared options checked and turned into a CommandContext; every refusal here is a usage error (exit 2).
    `seed_name` is where the seed came from, for the warning that it changes nothing; None: no warning yet (the
    options are not final: `vitcli run` completes them from its config and builds the context again)."""
    if quiet:
        # Pillow, numpy, matplotlib and torch speak through `warnings`; --quiet means none of it.
        warnings.simplefilter("ignore")
        os.environ.setdefault("PYTHONWARNINGS", "ignore")
    if seed_name is not None and seed is not None and weights is not Weights.random:
        source = "the checkpoint's" if checkpoint is not None else "the pretrained"
        print(
            f"warning: {seed_name} only applies to {'--weights random' if seed_name == '--seed' else 'random weights'}"
            f"; {source} weights are used and the seed changes nothing",
            file=sys.stderr,
        )
    if labels is not None and labels_file is not None:
        raise UsageError("--labels and --labels-file both name the classes: give one")
    labels_path, label_names = parse_labels(labels)
    templates = tuple(template or ())
    check_templates(templates)
    spec = WeightsSpec(
        model_name=model,
        random=weights is Weights.random,
        seed=seed if seed is not None else 0,
        checkpoint=checkpoint,
        labels=labels_file if labels_file is not None else labels_path,
        label_names=label_names,
        templates=templates,
    )
    return CommandContext(
        command=command,
        spec=spec,
        device=device.value,
        batch_size=batch_size,
        output_dir=check_output_dir(output_dir, DEFAULT_OUTPUT),
        format=format.value,
        quiet=quiet,
        figures=figures,
        fail_fast=fail_fast,
        shard=Shard.parse(shard) if shard is not None else None,
    )


def _given_on_the_command_line(parse_context: typer.Context, values: dict[str, Any]) -> dict[str, Any]:
    """The shared options the user typed (not defaults): `vitcli run` lets exactly these override its config."""
    return {
        name: value
        for name, value in values.items()
        if getattr(parse_context.get_parameter_source(name), "name", None) == "COMMANDLINE"
    }


def _fail(message: str, exit_code: int) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise typer.Exit(exit_code)


def _silence_stdout() -> None:
    """After a reader closed the pipe, point stdout at /dev/null so Python's exit flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def run() -> None:
    """The console script: parse errors become one line too (exit 2), like the commands' own errors, and the process
    ends without the interpreter's teardown (end_process) unless a tracer or profiler is watching or a non-daemon
    thread is still alive."""
    collector.pause()
    try:
        _run()
    except SystemExit as exit_:
        if sys.gettrace() is None and sys.getprofile() is None and not _non_daemon_threads_alive():
            end_process(exit_.code)
        raise
    finally:
        collector.before_exit()


def _non_daemon_threads_alive() -> bool:
    # os._exit skips the interpreter's teardown, which is safe only when nothing else must finish: profilers and
    # coverage write their files at exit (checked by the caller), and Python waits for a non-daemon thread that
    # other code started, where os._exit would kill it mid-work; then the process exits the usual way.
    return any(not thread.daemon and thread is not threading.main_thread() for thread in threading.enumerate())


def end_process(code: int | str | None) -> NoReturn:
    """Exit with `code` once the exit handlers have run and stdout and stderr are flushed, skipping the interpreter's
    teardown.

    Teardown frees, one by one, the millions of objects that importing torch, timm and matplotlib created: about 0.2 s
    of every command on a 2-core machine (benchmarks/startup.py measures it). Nothing of vitcli's needs it: the output
    store has synced and closed its files and the forward threads have stopped before a command returns.
    """
    if isinstance(code, str):
        print(code, file=sys.stderr)
    status = code if isinstance(code, int) else 0 if code is None else 1
    atexit._run_exitfuncs()  # what the interpreter would run first (logging, temporary files, weakref finalizers)
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # the reader left before the last buffered output
        _silence_stdout()
        status = status or EXIT_BROKEN_PIPE
    try:
        sys.stderr.flush()
    except OSError:
        pass  # nowhere left to say anything
    os._exit(status)


def _run() -> None:
    for stream in (sys.stdout, sys.stderr):
        # A file name the terminal's encoding cannot show is escaped, never a crash after the files are written.
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    interrupts.install()
    if len(sys.argv) == 1:
        sys.argv.append("--help")
    try:
        status = app(standalone_mode=False)
    except typer.TyperException as error:
        context = getattr(error, "ctx", None)
        hint = f" (see '{context.command_path} --help')" if context is not None else ""
        print(f"error: {error.format_message()}{hint}", file=sys.stderr)
        sys.exit(getattr(error, "exit_code", 1))
    except typer.Exit as exit_:
        sys.exit(exit_.exit_code)
    except typer.Abort:
        print("error: interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except (KeyboardInterrupt, interrupts.Terminated) as error:
        print("error: " + ("interrupted" if isinstance(error, KeyboardInterrupt) else "terminated"), file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED if isinstance(error, KeyboardInterrupt) else EXIT_TERMINATED)
    except BrokenPipeError:
        _silence_stdout()
        sys.exit(EXIT_BROKEN_PIPE)
    # Without standalone mode a typer.Exit raised inside a command comes back as its code.
    sys.exit(status if isinstance(status, int) else 0)
