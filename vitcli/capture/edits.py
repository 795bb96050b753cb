"""Edits a hook returns: parts of a batch's activation replaced, and the forward on from a block's input rows."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from torch import Tensor


@dataclass(frozen=True)
class Part:
    """Part of one batch row of a site's activation: one token (None: every token) and, at attn.hook_z, one head
    (one-based; None: every head, the whole width)."""

    row: int
    token: int | None = None
    head: int | None = None

    @property
    def within_row(self) -> tuple[Any, ...]:
        """The index of this part in one row (tokens, ...) of the activation."""
        return (slice(None) if self.token is None else self.token, ... if self.head is None else self.head - 1)


def replaced(activation: Tensor, edits: Iterable[tuple[Part, Callable[[Tensor], Tensor]]]) -> Tensor:
    """A copy of a (batch, tokens, ...) activation with each part set to function(the part's value), in turn."""
    activation = activation.clone()
    for part, function in edits:
        where = (part.row, *part.within_row)
        activation[where] = function(activation[where])
    return activation
