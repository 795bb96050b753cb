"""A command's Typer signature, made of declarations the library holds: the image argument, the command's own
options (its job builder's declared parameters, vitcli.declared_options) and the shared options
(vitcli.shared_options). A command function that takes `**options` gets its builder's options in their place."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer

from vitcli.declared_options import declared_options
from vitcli.shared_options import shared_parameters

# The image argument of every command that reads images.
ImagesArgument = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="IMAGE", help="Image files, folders or globs (default: a sample photo).", show_default=False
    ),
]


def command_parameters(
    function: Callable[..., Any], builder: Callable[..., Any] | None, shared: Sequence[str], parse_context: str
) -> list[inspect.Parameter]:
    """The parameters Typer reads for a command: the function's own after its CommandContext, with `**options`
    replaced by the builder's declared options (keyword-only, in the builder's order), then the shared options named
    in `shared`, then `parse_context`, a typer.Context (it tells which options were typed, not defaulted)."""
    own: list[inspect.Parameter] = []
    for parameter in list(inspect.signature(function, eval_str=True).parameters.values())[1:]:
        if parameter.kind is not inspect.Parameter.VAR_KEYWORD:
            own.append(parameter)
            continue
        if builder is None:
            raise TypeError(f"{function.__name__} takes **{parameter.name}: give vitcli_command the builder")
        own += [option.replace(kind=inspect.Parameter.KEYWORD_ONLY) for option in declared_options(builder)]
    context = inspect.Parameter(parse_context, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
    return own + shared_parameters(tuple(shared)) + [context]
