"""How much does one process save? `vitcli run configs/lecture.toml` against configs/lecture.sh (the same
experiments as separate vitcli processes), for one and for two images, random weights, measured in one run.

Prints the wall time of each, their ratio (goal: run / separate processes <= 0.5), and how the run's time splits into
start-up (imports, model build, image decoding: the wall time minus the experiments), the experiments' computation
(forwards) and their presentation and files (tables, figures, JSON, CSV), from the run's manifest.

    .venv/bin/python benchmarks/run.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VITCLI = str(Path(sys.executable).parent / "vitcli")
IMAGES = [ROOT / "examples" / "images" / "newfoundland_31.jpg", ROOT / "examples" / "images" / "Persian_98.jpg"]


def timed(command: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    subprocess.run(command, cwd=cwd, check=True, capture_output=True, env={**os.environ, "VITCLI": VITCLI})
    return time.perf_counter() - started


def main() -> None:
    import_seconds = timed([sys.executable, "-c", "import vitcli.loading"], ROOT)
    print(f"import vitcli.loading (torch, timm): {import_seconds:.2f} s")
    print(f"{'images':>6} {'run (s)':>8} {'separate (s)':>13} {'ratio':>6} {'start-up':>9} {'compute':>8} {'files':>6}")
    for count in (1, 2):
        images = [str(path) for path in IMAGES[:count]]
        with tempfile.TemporaryDirectory() as folder:
            work = Path(folder)
            run_seconds = timed(
                [
                    VITCLI,
                    "run",
                    str(ROOT / "configs" / "lecture.toml"),
                    *images,
                    "--weights",
                    "random",
                    "-q",
                    "-o",
                    "run",
                ],
                work,
            )
            separate_seconds = sum(
                timed(["bash", str(ROOT / "configs" / "lecture.sh"), image, "--weights", "random", "-q"], work)
                for image in images
            )
            manifest = json.loads((work / "run" / "lecture" / "manifest.json").read_text())
        compute = sum(entry["compute_seconds"] for entry in manifest["results"])
        files = sum(entry["write_seconds"] for entry in manifest["results"])
        startup = run_seconds - compute - files
        print(
            f"{count:>6} {run_seconds:>8.2f} {separate_seconds:>13.2f} {run_seconds / separate_seconds:>6.2f} "
            f"{startup:>8.2f}s {compute:>7.2f}s {files:>5.2f}s"
        )


if __name__ == "__main__":
    main()
