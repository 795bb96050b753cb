"""Small pieces of presentation that every table and figure shares."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult
    from rich.text import Text


def is_random(weights: str) -> bool:
    return weights.startswith("RANDOM")


def weights_caption(weights: str) -> str:
    """A table caption naming the weights; random weights are called out so nobody reads meaning into them."""
    if is_random(weights):
        return f"[bold red]{weights} WEIGHTS: untrained model, the numbers mean nothing[/bold red]"
    return f"weights: {weights}"


def weights_note(weights: str) -> str:
    """The same, as plain text for figure titles."""
    return f"{weights} WEIGHTS: untrained model" if is_random(weights) else f"weights: {weights}"


class FittedTables:
    """Tables laid out for the width they are printed at: a table is at least as wide as the longest word of its
    title (so `newfoundland_31.jpg` never breaks unless the console itself is narrower), and a caption longer than a
    narrow table reads as a paragraph under it at the console's width instead of a column of short lines (a table as
    wide as the console keeps rich's centred caption)."""

    def __init__(self, renderable: Any):
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from _fitted(self.renderable, console, options)


def fitted(renderable: Any) -> Any:
    """A table, a group of tables or any renderable, to print with FittedTables' layout (once)."""
    return renderable if isinstance(renderable, FittedTables) else FittedTables(renderable)


def _fitted(renderable: Any, console: Console, options: ConsoleOptions) -> RenderResult:
    from rich.console import Group
    from rich.table import Table

    if isinstance(renderable, Group):
        for part in renderable.renderables:
            yield from _fitted(part, console, options)
        return
    if not isinstance(renderable, Table) or renderable.width is not None:
        yield renderable
        return
    table = copy.copy(renderable)
    if table.title:
        words = _text(console, table.title).plain.split()
        longest = max((len(word) for word in words), default=0)
        if longest > console.measure(table, options=options).maximum:
            table.min_width = min(options.max_width, longest)
    if table.caption:
        caption = _text(console, table.caption, style=table.caption_style or "table.caption")
        width = console.measure(table, options=options).maximum
        if width < options.max_width and any(len(line) > width for line in caption.plain.splitlines()):
            table.caption = None
            yield table
            yield caption
            return
    yield table


def _text(console: Console, text: Any, style: Any = "") -> Text:
    """A title or caption as rich shows it: a string is markup (captions use it for the weights' warning)."""
    return console.render_str(text, style=style, highlight=False) if isinstance(text, str) else text.copy()
