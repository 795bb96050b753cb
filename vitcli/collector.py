"""Python's cyclic garbage collector in a `vitcli` process: held back while the process starts, then on for the work.

Importing torch, timm and matplotlib creates millions of Python objects that live until the process ends. With the
collector on, Python scans them again and again while the imports create them, and once more when the interpreter
shuts down: about 1.9 s of a 5.4 s `import torch, timm, matplotlib.pyplot` process on a 2-core machine
(benchmarks/startup.py measures it in each run). So the console script calls `pause` before anything heavy is
imported, and nothing else: the collector settles itself. Library callers and tests never pause it.
"""

from __future__ import annotations

import gc
from typing import Any

# Why a threshold and not gc.disable() with a call that turns it back on: start-up ends in different places for
# different commands (after the model loads, or when a report has imported matplotlib), and a call in each of them is
# easy to forget. Instead the youngest generation's threshold is raised above what start-up allocates (about 0.7
# million tracked objects for torch, timm, matplotlib and a ViT), so start-up runs without a collection; the first
# collection that this threshold lets through freezes everything alive (moved where the collector never looks again:
# it was built by start-up or will be freed by reference counting) and puts Python's thresholds back, so the cyclic
# garbage of a long run over many images is still freed. A command that ends sooner never collects at all.
START_UP_ALLOCATIONS = 2_000_000

_thresholds: tuple[int, ...] | None = None  # Python's own, while start-up holds the collector back


def pause() -> None:
    """Hold the collector back until start-up is over (it settles itself): the console script calls this first."""
    global _thresholds
    if not gc.isenabled() or _thresholds is not None:
        return
    _thresholds = gc.get_threshold()
    gc.set_threshold(START_UP_ALLOCATIONS, *_thresholds[1:])
    gc.callbacks.append(_settle)


def _settle(phase: str, _info: dict[str, Any]) -> None:
    """Before the first collection after start-up: freeze what start-up built, so this and every later collection
    skip it, and collect as Python usually does."""
    global _thresholds
    if phase != "start" or _thresholds is None:
        return
    gc.freeze()
    gc.set_threshold(*_thresholds)
    _thresholds = None
    # It stays in gc.callbacks, returning at once: removing it while Python walks that list would skip the next one.


def before_exit() -> None:
    """Freeze everything, so the interpreter's last collection at shutdown has nothing left to scan."""
    gc.freeze()
