"""Where does the time of one `vitcli occlude-patches` go, and how does the whole process compare with captum?

Measured in one run, random weights (seed 0), one photo, 196 covers of 16x16 pixels:
  1. the phases of the command, each timed in a fresh process in the order the command runs them: imports (torch,
     timm, matplotlib, vitcli), the architecture check, building the model, the parameter hash, decoding the image,
     the covered forwards, the figure, and the files;
  2. whole processes: `vitcli occlude-patches` against an equivalent hand-written captum script (goal: at most 0.9x),
     and `vitcli occlude-patches` minus `vitcli predict` (the cost of 196 covers as a user sees it) as a fraction of
     this machine's best matmul rate (goal: at least 0.6);
  3. processes that only import torch, timm and matplotlib, with Python's collector as it starts and with the
     console script's policy (vitcli/collector.py: paused for start-up, then everything frozen).

    .venv/bin/python benchmarks/startup.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHOTO = ROOT / "examples" / "images" / "newfoundland_31.jpg"
VITCLI = str(Path(sys.executable).parent / "vitcli")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from occlusion import CAPTUM_SCRIPT, flops_per_cover, flops_per_image  # noqa: E402  (shared with that benchmark)

PHASES = r"""
import json, sys, time
marks = []
def mark(name):
    marks.append((name, time.perf_counter()))
mark("start")
from vitcli import collector
collector.pause()  # as the console script does
import torch
mark("import torch")
import timm
mark("import timm (and torchvision)")
import matplotlib.pyplot
mark("import matplotlib")
import vitcli.cli, vitcli.loading, vitcli.experiments.occlusion, vitcli.presentation.occlusion, vitcli.runner
mark("import vitcli")
from pathlib import Path
from vitcli.loading import describe, load_model
from vitcli.spec import WeightsSpec
spec = WeightsSpec(random=True, seed=0)
describe(spec)
mark("architecture check (meta skeleton)")
model = load_model(spec, "cpu")
collector.settle()
mark("build the model, random init")
model.parameter_sha256
mark("parameter SHA-256 (provenance)")
image = model.prepare(Path(sys.argv[1]))
clean = model.logits(image.input.unsqueeze(0))[0]
mark("decode, preprocess, clean forward")
from vitcli.experiments.occlusion import SlidingWindows, occlude_patches
windows = SlidingWindows(model.grid, 16, 16)
result = occlude_patches(model, image, windows, None, "gray", clean_logits=clean)
mark("196 covered forwards")
from vitcli.presentation import occlusion as view
figure = view.figure(result)
import io
figure.savefig(io.BytesIO(), format="png", dpi=150, bbox_inches="tight")
mark("figure (build and PNG)")
from vitcli.output import csv_text, json_text
json_text(view.document(result)); csv_text(view.rows(result)); view.table(result)
mark("JSON, CSV and table")
print(json.dumps([(name, end - start) for (_, start), (name, end) in zip(marks, marks[1:])]))
"""

# The same imports with Python's collector as it comes, and as the console script runs it (vitcli/collector.py).
IMPORTS = "import torch, timm, matplotlib.pyplot"
COLLECTOR = {
    "imports, collector as Python starts it": IMPORTS,
    "imports, collector paused then frozen (vitcli)": (
        "from vitcli import collector; collector.pause(); " + IMPORTS + "; collector.settle(); collector.before_exit()"
    ),
}


def timed(command: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    finished = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if finished.returncode != 0:
        raise SystemExit(f"{command[:3]} failed: {finished.stderr.strip()[-300:]}")
    return time.perf_counter() - started


def matmul_rate() -> float:
    """The best of five 2048x2048 fp32 products, in FLOP/s: the least disturbed by other load, so the strictest."""
    import torch

    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - started)
    return 2 * 2048**3 / best


def sustained_matmul_rate(seconds: float = 3.0) -> float:
    """2048x2048 fp32 products back to back for `seconds`, in FLOP/s: what the machine sustains under its present
    load, as the covers experience it (on a shared machine this falls further below the best-of-five than bursts do)."""
    import torch

    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        a @ b
        count += 1
    return count * 2 * 2048**3 / (time.perf_counter() - started)


def cover_flops() -> tuple[int, int]:
    """FLOPs (FlopCounterMode) of one full forward of the photo, and of the forward vitcli runs per patch cover."""
    from vitcli.loading import load_model
    from vitcli.spec import WeightsSpec

    model = load_model(WeightsSpec(random=True, seed=0), "cpu")
    image = model.prepare(PHOTO).input
    return flops_per_image(model, image), flops_per_cover(model, image)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    arguments = parser.parse_args()
    rate_before, sustained_before = matmul_rate(), sustained_matmul_rate()
    phases = subprocess.run([sys.executable, "-c", PHASES, str(PHOTO)], capture_output=True, text=True, check=True)
    print("phases of occlude-patches, in one fresh process:")
    total = 0.0
    for name, seconds in json.loads(phases.stdout.strip().splitlines()[-1]):
        total += seconds
        print(f"  {name:40} {seconds:6.2f} s")
    print(f"  {'total':40} {total:6.2f} s")

    common = ["--weights", "random", "--seed", "0", "--device", "cpu", "-q"]
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        (work / "captum_occlusion.py").write_text(CAPTUM_SCRIPT)  # not captum.py: it would shadow captum
        commands = {
            "vitcli occlude-patches": [VITCLI, "occlude-patches", str(PHOTO), *common, "-o", "out"],
            "vitcli predict": [VITCLI, "predict", str(PHOTO), *common, "-o", "out"],
            "captum script, perturbations_per_eval 1 (captum's default)": [
                sys.executable,
                "captum_occlusion.py",
                str(PHOTO),
                "captum1.csv",
                "1",
            ],
            "captum script, perturbations_per_eval 8 (vitcli's batch)": [
                sys.executable,
                "captum_occlusion.py",
                str(PHOTO),
                "captum8.csv",
                "8",
            ],
        }
        commands.update({name: [sys.executable, "-c", code] for name, code in COLLECTOR.items()})
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(arguments.repeats):  # alternating, so drifts in load hit every command alike
            for name, command in commands.items():
                times[name].append(timed(command, work))
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"\nwhole processes, median of {arguments.repeats}:")
    for name, seconds in medians.items():
        print(f"  {name:42} {seconds:6.2f} s   ({', '.join(f'{value:.2f}' for value in times[name])})")
    occlude, predict, captum_default, captum_batched, imports_plain, imports_vitcli = medians.values()
    print(
        f"  the collector policy saves {imports_plain - imports_vitcli:.2f} s of importing torch, timm and matplotlib "
        f"({imports_vitcli / imports_plain:.2f} of the time)"
    )
    print(f"  occlude-patches / captum script with its default: {occlude / captum_default:.2f} (goal <= 0.9)")
    print(f"  occlude-patches / captum script batched like vitcli: {occlude / captum_batched:.2f}")
    flops, executed = (196 * count for count in cover_flops())
    rate = max(matmul_rate(), rate_before)
    sustained = (sustained_before + sustained_matmul_rate()) / 2
    covers = occlude - predict
    print(
        f"  196 covers as a user sees them (occlude-patches - predict): {covers:.2f} s = {flops / covers / 1e9:.0f} "
        f"GFLOP/s of full forwards = {flops / covers / rate:.2f} of this machine's best matmul rate "
        f"{rate / 1e9:.0f} GFLOP/s (goal >= 0.6); counting only the FLOPs vitcli runs: {executed / covers / rate:.2f}"
    )
    print(
        f"  for context, products sustained for 3 s before and after the processes: {sustained / 1e9:.0f} GFLOP/s "
        f"({sustained / rate:.2f} of the best); the covers reach {flops / covers / sustained:.2f} of that"
    )


if __name__ == "__main__":
    main()
