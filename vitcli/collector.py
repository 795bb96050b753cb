"""Python's cyclic garbage collector in a `vitcli` process: paused while the process starts, on for the work.

Importing torch, timm and matplotlib creates millions of Python objects that live until the process ends. With the
collector on, Python scans them again and again while the imports create them, and once more when the interpreter
shuts down: about 1.9 s of a 5.4 s `import torch, timm, matplotlib.pyplot` process on a 2-core machine
(benchmarks/startup.py measures it in each run). So the console script pauses the collector before anything heavy is
imported; once the model is loaded, everything alive is frozen (moved where the collector never looks again) and the
collector runs as usual, so the cyclic garbage of a long run over many images is still freed. Library callers and
tests never pause it: `settle` changes nothing unless `pause` ran.
"""

from __future__ import annotations

import gc

_paused = False


def pause() -> None:
    """Stop collecting until `settle`: the console script calls this first."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def settle() -> None:
    """Start-up is over: freeze what it built and collect again. A no-op unless `pause` ran."""
    global _paused
    if _paused:
        gc.freeze()
        gc.enable()
        _paused = False


def before_exit() -> None:
    """Freeze everything, so the interpreter's last collection at shutdown has nothing left to scan."""
    gc.freeze()
