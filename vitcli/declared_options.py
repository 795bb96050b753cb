"""Options declared once, as the typed parameters of a function: `name: Annotated[T, typer.Option(...)] = default`.

Each job builder's options (vitcli.jobs) and the shared options (vitcli.shared_options) are declared this way. The
command line puts the declarations on its Typer commands (vitcli.options); `vitcli run` configs and the Python API
convert a value through the click parameter Typer builds from the same declaration, so a value is converted and
refused exactly as on the command line, with the same words (reword_bad_value). Typer is a dependency of the
library; nothing here imports the command line or torch.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Annotated, Any, get_origin

import typer
import typer.main
import typer.models


def declared_options(function: Callable[..., Any]) -> list[inspect.Parameter]:
    """The parameters of `function` declared as command-line options, in order, their annotations evaluated; the
    others (a builder's `run_images`, patch's `corrupt`) are not options: the command line gives them otherwise."""
    signature = inspect.signature(function, eval_str=True)
    return [parameter for parameter in signature.parameters.values() if is_option(parameter.annotation)]


def is_option(annotation: Any) -> bool:
    return get_origin(annotation) is Annotated and any(
        isinstance(metadata, typer.models.OptionInfo) for metadata in annotation.__metadata__
    )


def click_command(parameters: list[inspect.Parameter]) -> Any:
    """The click command Typer makes of a function with these parameters: its `params` convert values as the
    command line's do (same types, ranges, choices and messages)."""

    def options(**values: Any) -> None:
        """Only its signature is read."""

    keyword_only = [parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY) for parameter in parameters]
    options.__signature__ = inspect.Signature(keyword_only)  # type: ignore[attr-defined]
    options.__annotations__ = {parameter.name: parameter.annotation for parameter in keyword_only}
    app = typer.Typer(add_completion=False)
    app.command()(options)
    return typer.main.get_command(app)


_VALIDATOR_PREFIX = "Value error, "  # how Typer's validation (pydantic) prefixes a refusal it passes on
_NOT_A_CHOICE = re.compile(r"^(?P<value>'.*') is not one of ")


def reword_bad_value(error: typer.BadParameter) -> None:
    """A refused value in plain words, in place: without the validator's "Value error, " prefix, and for a choice
    the choices as the help lists them with the closest one: `'maps' is not one of map, summary, rollout, all-blocks
    (did you mean map?)`."""
    message = error.message.removeprefix(_VALIDATOR_PREFIX)
    descriptor = getattr(error.param, "type_descriptor", None)
    not_a_choice = _NOT_A_CHOICE.match(message)
    if descriptor is not None and descriptor.is_choice and descriptor.choices and not_a_choice:
        import ast
        import difflib

        value = ast.literal_eval(not_a_choice["value"])
        choices = [str(getattr(choice, "value", choice)) for choice in descriptor.choices]
        message = f"{value!r} is not one of {', '.join(choices)}"
        closest = difflib.get_close_matches(str(value).lower(), choices, n=1, cutoff=0.6)
        if closest:
            message += f" (did you mean {closest[0]}?)"
    error.message = message
