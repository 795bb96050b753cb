"""SIGINT and SIGTERM as exceptions, held back while a result's files are being swapped into place.

A signal normally interrupts wherever Python is, so every `finally` runs and temporary files are removed. Inside
`deferred()` (the few renames that publish one result) the signal is remembered and raised right after, so a kill
never leaves half of a result's files new and half old.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class Terminated(BaseException):
    """SIGTERM, raised like KeyboardInterrupt so that cleanup code runs."""


_state = {"depth": 0, "pending": None}


def _exception(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated()


def _handle(signum: int, _frame: FrameType | None) -> None:
    if _state["depth"]:
        _state["pending"] = signum
        return
    raise _exception(signum)


def install() -> None:
    """Route SIGINT and SIGTERM through `_handle` (main thread only, as Python requires)."""
    signal.signal(signal.SIGINT, _handle)
    signal.signal(signal.SIGTERM, _handle)


@contextmanager
def deferred() -> Iterator[None]:
    _state["depth"] += 1
    try:
        yield
    finally:
        _state["depth"] -= 1
        pending = _state["pending"]
        if not _state["depth"] and pending is not None:
            _state["pending"] = None
            raise _exception(pending)
