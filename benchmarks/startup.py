"""Where does the time of one `vitcli occlude-patches` go, and how does the whole process compare with captum?

Measured in one run, random weights (seed 0), one photo, 196 covers of 16x16 pixels:
  1. the phases of the command, each timed in a fresh process in the order the command runs them: imports (torch,
     timm, matplotlib, vitcli), the architecture check, building the model, the parameter hash, decoding the image,
     the covered forwards, the figure, and the files;
  2. whole processes: `vitcli occlude-patches` against an equivalent hand-written captum script (goal: at most 0.9x),
     and `vitcli occlude-patches` minus `vitcli predict` (the cost of 196 covers as a user sees it) as a fraction of
     this machine's matmul rate (goal: at least 0.6), counting a full forward's FLOPs per cover (attention included,
     see occlusion.py's counted_flops). The goal line pairs each round's two processes with the best-of-five rate
     measured just before them and takes the median over rounds: on a shared machine whose rate drifts, that
     compares the covers with the machine as it was when they ran. The strictest reading is printed beside it: the
     median processes against the best rate of the whole run, a burst that the processes themselves rarely see;
  3. processes that only import torch, timm and matplotlib, with Python's collector as it starts and with the
     console script's policy (vitcli/collector.py: held back for start-up, then everything frozen);
  4. how long a `vitcli predict` process takes to end once its command has returned: with the console script's
     end_process (vitcli/shell.py: exit handlers run and output flushed, the objects start-up built left to the
     operating system), and with the interpreter's teardown (timed from inside: the whole processes vary by more).
The two sides of each comparison run back to back, one first in one round and the other in the next; what a policy
saves is the median over rounds of the two sides' difference.

    .venv/bin/python benchmarks/startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
PHOTO = ROOT / "examples" / "images" / "newfoundland_31.jpg"
VITCLI = str(Path(sys.executable).parent / "vitcli")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from occlusion import CAPTUM_SCRIPT, flops_per_cover, flops_per_image, matmul_rate  # noqa: E402  (shared)

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
mark("build the model, random init")
model.parameter_sha256
mark("parameter SHA-256 (provenance)")
image = model.prepare(Path(sys.argv[1]))
clean = model.logits(image.input.unsqueeze(0))[0]
mark("decode, preprocess, clean forward")
from vitcli.experiments.covers import SlidingWindows
from vitcli.experiments.occlusion import occlude_patches
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
    "imports, collector held back then frozen (vitcli)": (
        "from vitcli import collector; collector.pause(); " + IMPORTS + "; collector.before_exit()"
    ),
}


OCCLUDE, PREDICT = "vitcli occlude-patches", "vitcli predict"
CAPTUM_DEFAULT = "captum script, perturbations_per_eval 1 (captum's default)"
CAPTUM_BATCHED = "captum script, perturbations_per_eval 8 (vitcli's batch)"

# `vitcli predict` that prints when its command returned, then ends as the console script does or, with "teardown" as
# its first argument, as Python does (end_process switched off).
EXIT_PROBE = """
import sys, time
from vitcli import shell
end_process = shell.end_process
teardown = sys.argv.pop(1) == "teardown"
def returned(code):
    print(time.time(), file=sys.stderr, flush=True)
    if not teardown:
        end_process(code)
shell.end_process = returned
from vitcli.cli import main
sys.argv[0] = "vitcli"
main()
"""


def timed(command: list[str], cwd: Path) -> tuple[float, float, int]:
    """Seconds, CPU seconds (user and system) and minor page faults of one process (they run one at a time)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    finished = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if finished.returncode != 0:
        raise SystemExit(f"{command[:3]} failed: {finished.stderr.strip()[-300:]}")
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return seconds, cpu, after.ru_minflt - before.ru_minflt


def exit_seconds(ending: str, arguments: list[str], cwd: Path) -> float:
    """Seconds from the moment a vitcli command returned to the end of its process (EXIT_PROBE)."""
    finished = subprocess.run(
        [sys.executable, "-c", EXIT_PROBE, ending, *arguments], cwd=cwd, capture_output=True, text=True, check=True
    )
    ended = time.time()
    return ended - float(finished.stderr.strip().splitlines()[-1])


def sustained_matmul_rate(seconds: float = 3.0) -> float:
    """2048x2048 fp32 products back to back for `seconds`, in GFLOP/s: what the machine sustains under its present
    load, as the covers experience it (on a shared machine this falls further below the best-of-five than bursts do)."""
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        a @ b
        count += 1
    return count * 2 * 2048**3 / (time.perf_counter() - started) / 1e9


def cover_flops() -> tuple[int, int, int]:
    """FLOPs (FlopCounterMode, attention included) of one full forward of the photo and of the forward vitcli runs per
    patch cover, and a full forward's as this benchmark counted before (the attention products left out)."""
    from vitcli.loading import load_model
    from vitcli.spec import WeightsSpec

    model = load_model(WeightsSpec(random=True, seed=0), "cpu")
    image = model.prepare(PHOTO).input
    return flops_per_image(model, image), flops_per_cover(model, image), flops_per_image(model, image, attention=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
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
        occlude = ["occlude-patches", str(PHOTO), *common, "-o", "out"]
        predict = ["predict", str(PHOTO), *common, "-o", "out"]
        # Each comparison runs back to back within a round, first one side and then, next round, the other first
        # (every other round runs the list backwards), so that drifts in load hit both sides alike.
        commands = {
            OCCLUDE: [VITCLI, *occlude],
            PREDICT: [VITCLI, *predict],
            CAPTUM_DEFAULT: [sys.executable, "captum_occlusion.py", str(PHOTO), "captum1.csv", "1"],
            CAPTUM_BATCHED: [sys.executable, "captum_occlusion.py", str(PHOTO), "captum8.csv", "8"],
            **{name: [sys.executable, "-c", code] for name, code in COLLECTOR.items()},
        }
        measured: dict[str, list[tuple[float, float, int]]] = {name: [] for name in commands}
        rates = []  # each round's best-of-five matmul rate, measured just before its occlude-patches and predict
        for round_number in range(arguments.repeats):
            order = list(commands.items())
            for name, command in order if round_number % 2 == 0 else reversed(order):
                if name in (OCCLUDE, PREDICT) and len(rates) == round_number:
                    rates.append(matmul_rate())
                measured[name].append(timed(command, work))
        exits = {
            ending: statistics.median(exit_seconds(ending, predict, work) for _ in range(arguments.repeats))
            for ending in ("end_process", "teardown")
        }
    medians = {name: statistics.median(seconds for seconds, _, _ in runs) for name, runs in measured.items()}
    cpu = {name: statistics.median(seconds for _, seconds, _ in runs) for name, runs in measured.items()}
    print(f"\nwhole processes, median of {arguments.repeats} (each run; median CPU time and page faults):")
    for name, seconds in medians.items():
        runs = ", ".join(f"{run[0]:.2f}" for run in measured[name])
        faults = statistics.median(run[2] for run in measured[name])
        print(f"  {name:42} {seconds:6.2f} s   ({runs}; CPU {cpu[name]:.2f} s, {faults:,.0f} faults)")

    def saved(without: str, policy: str) -> str:
        """What a policy saves: the median over rounds of the two processes' difference, and in how many rounds."""
        differences = [off[0] - on[0] for off, on in zip(measured[without], measured[policy], strict=True)]
        cpu_differences = [off[1] - on[1] for off, on in zip(measured[without], measured[policy], strict=True)]
        return (
            f"{statistics.median(differences):.2f} s (median of the rounds' differences; less time in "
            f"{sum(difference > 0 for difference in differences)} of {len(differences)} rounds) and "
            f"{statistics.median(cpu_differences):.2f} s of CPU time"
        )

    imports_plain, imports_vitcli = COLLECTOR
    print(f"  importing torch, timm and matplotlib: the collector policy saves {saved(imports_plain, imports_vitcli)}")
    print(
        f"  a predict process ends {exits['end_process']:.2f} s after its command returned (median of "
        f"{arguments.repeats}), {exits['teardown']:.2f} s with the interpreter's teardown"
    )
    occlude, predict = medians[OCCLUDE], medians[PREDICT]
    captum_default, captum_batched = medians[CAPTUM_DEFAULT], medians[CAPTUM_BATCHED]
    print(f"  occlude-patches / captum script with its default: {occlude / captum_default:.2f} (goal <= 0.9)")
    print(f"  occlude-patches / captum script batched like vitcli: {occlude / captum_batched:.2f}")
    flops, executed, without_attention = (196 * count / 1e9 for count in cover_flops())  # GFLOP
    # The goal line: each round's two processes against the machine as it was then (the rate just before them).
    pairs = list(zip(measured[OCCLUDE], measured[PREDICT], rates, strict=True))
    rounds = [flops / (occlude_run[0] - predict_run[0]) / round_rate for occlude_run, predict_run, round_rate in pairs]
    paired_seconds = statistics.median(occlude_run[0] - predict_run[0] for occlude_run, predict_run, _ in pairs)
    print(
        f"  196 covers as a user sees them (occlude-patches - predict), round by round against the best-of-five "
        f"matmul rate measured just before the two: median {statistics.median(rounds):.2f} (goal >= 0.6; rounds "
        f"{', '.join(f'{fraction:.2f}' for fraction in rounds)}; median difference {paired_seconds:.2f} s)"
    )
    rate = max(matmul_rate(), rate_before, *rates)
    sustained = (sustained_before + sustained_matmul_rate()) / 2
    covers = occlude - predict
    print(
        f"  the strictest reading, median processes against the best rate of the whole run: {covers:.2f} s = "
        f"{flops / covers:.0f} GFLOP/s of full forwards = {flops / covers / rate:.2f} of {rate:.0f} "
        f"GFLOP/s; counting only the FLOPs vitcli runs: {executed / covers / rate:.2f}; counted as before this "
        f"benchmark included attention: {without_attention / covers / rate:.2f}"
    )
    print(
        f"  for context, products sustained for 3 s before and after the processes: {sustained:.0f} GFLOP/s "
        f"({sustained / rate:.2f} of the best); the covers reach {flops / covers / sustained:.2f} of that"
    )


if __name__ == "__main__":
    main()
