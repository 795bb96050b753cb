"""The C allocator in a `vitcli` process: memory freed by one batch's forward is kept for the next.

torch takes tensor memory from the C library's malloc. glibc hands blocks over its mmap threshold back to the kernel
when they are freed, and trims free space over its trim threshold off the top of a heap; the next batch then writes
to fresh pages, which the kernel must map and zero-fill again on first touch. glibc adapts both thresholds, but not
far enough for batches of forwards. So the console script raises them before torch is imported, and the process
keeps its peak heap until it exits (about 70 MiB more at the peak of `vitcli occlude-patches`).

Measured on a 2-core virtual machine: a whole `vitcli occlude-patches` takes 188,000 page faults instead of
279,000-341,000, and its 196 covers alone ran 0.15 s faster (median of 10 alternating pairs); whole processes ran from
0.2 s slower to 1.2 s faster as the load on that machine varied (docs/models.md; benchmarks/startup.py measures it
again in each run).
Library callers and tests keep the C library's defaults.
"""

from __future__ import annotations

import ctypes
import os

# mallopt's parameter numbers (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# glibc's largest mmap threshold on 64-bit systems (half its 64 MiB heap size); larger blocks are still mapped.
MMAP_THRESHOLD = 32 * 2**20
# Free space at the top of a heap kept for reuse: larger than a forward's activations at the default batch size.
TRIM_THRESHOLD = 256 * 2**20


def runs_on_glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (AttributeError, ValueError, OSError):  # no confstr, no such name, or no value: not glibc
        return False


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; False, changing nothing, on another C library."""
    if not runs_on_glibc():
        return False
    mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # mallopt returns 1 on success. Setting either threshold ends glibc's adapting of both, and a raised trim
    # threshold under the initial 128 KiB mmap threshold would map and unmap far more often: mmap's goes first.
    return mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
