"""Small pieces of presentation that every table and figure shares.

Every text from a user (a file name, a class label, a config value) reaches a page as written: rich reads a str
title, caption, header or cell as markup (`[red]dog[/red]` would lose its brackets, `:dog:` become an emoji), so
every table is printed through `fitted`, which turns them into plain Text; the one styled piece, the random weights'
warning, is a Text already. Figures draw a user's text with `parse_math=False` (vitcli.figures).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult
    from rich.table import Table
    from rich.text import Text


def is_random(weights: str) -> bool:
    return weights.startswith("RANDOM")


def weights_caption(weights: str) -> Text:
    """A table caption naming the weights; random weights are called out so nobody reads meaning into them. A Text
    (join it to other lines with Text.assemble): a str caption is printed as written, without style."""
    from rich.text import Text

    if is_random(weights):
        return Text(f"{weights} WEIGHTS: untrained model, the numbers mean nothing", style="bold red")
    return Text(f"weights: {weights}")


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
    if isinstance(renderable, str):
        yield _plain(renderable)
        return
    if not isinstance(renderable, Table):
        yield renderable
        return
    table = _literal(renderable)
    if table.width is not None:
        yield table
        return
    if table.title:
        words = table.title.plain.split()
        longest = max((len(word) for word in words), default=0)
        if longest > console.measure(table, options=options).maximum:
            table.min_width = min(options.max_width, longest)
    if table.caption:
        caption = table.caption.copy()
        width = console.measure(table, options=options).maximum
        if width < options.max_width and any(len(line) > width for line in caption.plain.splitlines()):
            table.caption = None
            yield table
            yield caption
            return
    yield table


def _literal(table: Table) -> Table:
    """A copy of the table whose str title, caption, headers, footers and cells are plain Text (nested tables too),
    styled as rich styles a str."""
    from rich.table import Table

    literal = copy.copy(table)
    literal.title = _plain(table.title, table.title_style or "table.title")
    literal.caption = _plain(table.caption, table.caption_style or "table.caption")
    literal.columns = []
    for column in table.columns:
        column = copy.copy(column)
        column.header, column.footer = _plain(column.header), _plain(column.footer)
        column._cells = [_literal(cell) if isinstance(cell, Table) else _plain(cell) for cell in column._cells]
        literal.columns.append(column)
    return literal


def _plain(text: Any, style: Any = "") -> Any:
    """A str as plain Text in `style`; a Text keeps its own styles over `style` (a title or caption in the table's
    title or caption style, as a str would be); any other renderable is left as it is."""
    from rich.text import Text

    if isinstance(text, str) or (isinstance(text, Text) and style):
        return Text.assemble(text, style=style)
    return text
