"""Does raising glibc's malloc thresholds help a `vitcli` run? Peak memory and wall time, with and without, in one run.

The tweak once in the console script: before torch is imported, glibc's mmap threshold raised to 32 MiB and its trim
threshold to 256 MiB (mallopt), so memory freed by one batch of forwards stays in the heap for the next batch instead
of going back to the kernel and being faulted in again. The representative run: `vitcli occlude-patches` over the
two example photos (196 covers each, ViT-Tiny, random weights, CPU). Each round runs both sides in fresh processes,
back to back, the side that goes first alternating between rounds; each process's own rusage (os.wait4) gives its
peak resident memory and its page faults. Printed: every round, and the ratios tweak/default of the medians and the
median of the rounds' ratios. Only a quiet machine answers the question: on a shared one the load drifts by more
than the effect.

    .venv/bin/python benchmarks/allocator.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = [str(ROOT / "examples" / "images" / name) for name in ("newfoundland_31.jpg", "Persian_98.jpg")]

# The console script, with the tweak applied first when the first argument says so.
PROCESS = """
import ctypes, sys
if sys.argv.pop(1) == "tweak":
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # M_MMAP_THRESHOLD (-3) first: a raised trim threshold under the initial mmap threshold maps far more often.
    assert mallopt(-3, 32 * 2**20) == 1 and mallopt(-1, 256 * 2**20) == 1
from vitcli.cli import main
sys.argv[0] = "vitcli"
main()
"""


def measured(side: str, arguments: list[str], cwd: Path) -> tuple[float, float, int]:
    """Seconds, peak resident MiB and minor page faults of one process."""
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-c", PROCESS, side, *arguments], cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the {side} process failed: {process.stderr.read().decode()[-300:]}")
    process.stderr.close()
    return seconds, usage.ru_maxrss / 1024, usage.ru_minflt  # ru_maxrss is in KiB on Linux


def main() -> None:
    if not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"):
        raise SystemExit("mallopt's thresholds exist on glibc only")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    command = ["occlude-patches", *IMAGES, "--weights", "random", "--seed", "0", "--device", "cpu", "-q", "-o", "out"]
    runs: dict[str, list[tuple[float, float, int]]] = {"default": [], "tweak": []}
    with tempfile.TemporaryDirectory() as folder:
        for round_number in range(rounds):
            sides = ["default", "tweak"] if round_number % 2 == 0 else ["tweak", "default"]
            for side in sides:
                runs[side].append(measured(side, command, Path(folder)))
            default, tweak = runs["default"][-1], runs["tweak"][-1]
            print(
                f"round {round_number + 1}: default {default[0]:.2f} s {default[1]:.0f} MiB {default[2]:,} faults; "
                f"tweak {tweak[0]:.2f} s {tweak[1]:.0f} MiB {tweak[2]:,} faults"
            )
    for index, name in enumerate(("wall time", "peak RSS", "page faults")):
        medians = [statistics.median(run[index] for run in runs[side]) for side in ("default", "tweak")]
        paired = statistics.median(t[index] / d[index] for d, t in zip(runs["default"], runs["tweak"], strict=True))
        print(
            f"{name:12} tweak/default: {medians[1] / medians[0]:.3f} of the medians "
            f"({medians[0]:,.2f} and {medians[1]:,.2f}), median of the rounds' ratios {paired:.3f}"
        )
    print(f"load average over 1, 5, 15 minutes at the end: {', '.join(f'{load:.1f}' for load in os.getloadavg())}")


if __name__ == "__main__":
    main()
