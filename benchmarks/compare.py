"""How `vitcli compare` grows with the number of images: N tiny generated images (64x64 PNGs of noise with a
coloured block), random weights, `vitcli compare FOLDER` in a subprocess for each N. Prints the wall time and the
peak memory (the child's maximum resident set) per N, and the peak's growth per image. Goal (issue 19): 200 images
under 2 GB, memory linear in N (only the N x N matrix is quadratic, and it is numbers).

    .venv/bin/python benchmarks/compare.py [N ...]   (default 10 50 200)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

VITCLI = str(Path(sys.executable).parent / "vitcli")


def tiny_images(folder: Path, count: int) -> Path:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for number in range(count):
        pixels = rng.integers(0, 256, size=(64, 64, 3), dtype=np.uint8)
        pixels[8:40, number % 24 : number % 24 + 24] = rng.integers(0, 256, 3)
        Image.fromarray(pixels).save(folder / f"tiny{number:04d}.png")
    return folder


def peak_of(command: list[str]) -> tuple[float, float]:
    """Wall seconds and peak resident MB of one `vitcli` process, read by a Python started for it alone (getrusage
    reports the largest child a process ever had, so each N gets its own parent)."""
    probe = (
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    started = time.perf_counter()
    output = subprocess.run([sys.executable, "-c", probe, *command], check=True, capture_output=True, text=True)
    return time.perf_counter() - started, int(output.stdout.split()[-1]) / 1024


def main() -> None:
    counts = [int(value) for value in sys.argv[1:]] or [10, 50, 200]
    print(f"load average {os.getloadavg()[0]:.1f}; vitcli compare FOLDER --weights random --device cpu")
    print(f"{'images':>6} {'seconds':>8} {'peak MB':>8} {'MB per image over the first':>28}")
    first = None
    with tempfile.TemporaryDirectory() as work:
        for count in counts:
            images = tiny_images(Path(work) / f"images{count}", count)
            out = Path(work) / f"out{count}"
            command = [VITCLI, "compare", str(images), "--weights", "random", "--device", "cpu", "-q", "-o", str(out)]
            seconds, peak = peak_of(command)
            growth = "" if first is None else f"{(peak - first[1]) / (count - first[0]):.2f}"
            first = first or (count, peak)
            print(f"{count:>6} {seconds:>8.1f} {peak:>8.0f} {growth:>28}")


if __name__ == "__main__":
    main()
