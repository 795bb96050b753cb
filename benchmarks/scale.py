"""Does a `vitcli run` cost the same per result at 10,000 images as at 500? N generated 64x64 PNGs, a config with
`predict` and `attend --view summary` (one hooked forward), random weights, `[output] figures = false` (the run's
own machinery is measured, not matplotlib: a figure costs about 0.1 s each), one process per N.

Prints per N: the wall time, seconds per result beyond a small run's fixed cost (imports, model build), in wall
time and in the process's CPU time (steadier on a shared machine), the bytes
the process wrote (write() calls, from /proc/self/io) per result and against the result files themselves, the run's
own files (records, manifest.json, summary.csv, the folders' index.json), and the peak memory of the process; then
`vitcli report` of that run folder (an index page beside one page per image beyond 40 images): its wall time, peak
memory, the index page's size and the largest image page. Goals (issue 19): seconds per result at the largest N
within 1.2x of the smallest; bytes written at most 2x the result files; the report of 2,000 images in under a minute
and under 1 GB, its index under 5 MB and an image's page under 3 MB.

    .venv/bin/python benchmarks/scale.py                      # N = 500, 2000, 10000
    .venv/bin/python benchmarks/scale.py --sizes 200,1000     # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

VITCLI = str(Path(sys.executable).parent / "vitcli")
BASELINE = 20  # images of the run that measures the fixed cost
CONFIG = """
name = "scale"
images = ["{images}"]
[model]
weights = "random"
device = "cpu"
batch-size = 16
[output]
figures = false
[[experiments]]
command = "predict"
[[experiments]]
command = "attend"
view = "summary"
"""
# The CLI through a wrapper that, at exit, writes the process's I/O counters and peak memory (Linux).
MEASURED = """
import atexit, resource, sys
target = sys.argv.pop(1)

def measure():
    counters = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
    usage = resource.getrusage(resource.RUSAGE_SELF)
    counters["maxrss_kib"] = usage.ru_maxrss
    counters["cpu_ms"] = int(1000 * (usage.ru_utime + usage.ru_stime))
    open(target, "w").write(repr({key: int(value) for key, value in counters.items()}))

atexit.register(measure)
sys.argv[0] = "vitcli"
from vitcli.cli import main
sys.exit(main())
"""


def images(folder: Path, count: int) -> None:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for index in range(count):
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(folder / f"im{index:05d}.png")


def measured_vitcli(work: Path, *arguments: str) -> tuple[float, dict[str, int]]:
    """Run vitcli in `work`; its wall seconds and the counters it wrote at exit."""
    counters = work / "counters"
    started = time.perf_counter()
    command = [sys.executable, "-c", MEASURED, str(counters), *arguments]
    subprocess.run(command, cwd=work, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall = time.perf_counter() - started
    return wall, eval(counters.read_text())  # noqa: S307  (a dict literal this script's child wrote)


def measure(count: int, report: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as name:
        work = Path(name)
        images(work / "pics", count)
        (work / "run.toml").write_text(CONFIG.format(images=work / "pics"))
        wall, measured = measured_vitcli(work, "run", "run.toml", "-q", "-f", "jsonl")
        root = work / "outputs" / "scale"
        results = len(json.loads((root / "manifest.json").read_text())["results"])
        files = [path for path in root.rglob("*") if path.is_file()]
        indexes = sum(path.stat().st_size for path in files if path.name == "index.json")
        own = sum(path.stat().st_size for path in files if path.parent == root or path.parent.name == "records")
        result_bytes = sum(path.stat().st_size for path in files if path.parent.parent.parent == root) - indexes
        row = {
            "images": count,
            "results": results,
            "wall": wall,
            "cpu": measured["cpu_ms"] / 1000,
            "written": measured["wchar"],
            "result_bytes": result_bytes,
            "index_bytes": indexes,
            "run_bytes": own,
            "peak_mib": measured["maxrss_kib"] / 1024,
        }
        if report:
            report_wall, report_measured = measured_vitcli(work, "report", str(root), "-q")
            pages = [path.stat().st_size for path in root.rglob("report.html") if path.parent != root]
            row |= {
                "report_wall": report_wall,
                "report_cpu": report_measured["cpu_ms"] / 1000,
                "report_peak_mib": report_measured["maxrss_kib"] / 1024,
                "report_index_bytes": (root / "report.html").stat().st_size,
                "report_largest_page": max(pages, default=0),
            }
        return row


def views_cost(count: int) -> str:
    """Reading a record of `count` images x 2 results and building both views, without the model: the part of a
    run's cost that grows with the run (once, at the end)."""
    from vitcli.batch.manifest import summary_frame
    from vitcli.batch.record import read_record
    from vitcli.batch.views import record_view
    from vitcli.output import json_text

    summary = {"top1_class": 3, "top1_label": "x", "top1_probability": 0.1, "mass": 0.4}
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name) / "records"
        folder.mkdir()
        images = [f"/data/im{index:05d}.png" for index in range(count)]
        run = {"name": "s", "identity": "i", "shard": None, "config": {"images": images}, "provenance": {}}
        with open(folder / "a.jsonl", "w") as stream:
            stream.write(json.dumps({"kind": "run", "at": 0, **run}) + "\n")
            for index, image in enumerate(images):
                for experiment in ("predict-k5", "attention-summary-qcls"):
                    files = [f"m/im{index:05d}-0123456789/{experiment}.{suffix}" for suffix in ("json", "csv")]
                    line = {"kind": "result", "at": index, "image": image, "image_sha256": "ab" * 32}
                    line |= {"subject": f"im{index:05d}-0123456789", "experiment": experiment, "command": experiment}
                    line |= {"settings": {}, "files": files, "compute_seconds": 0.01, "write_seconds": 0.01}
                    stream.write(json.dumps({**line, "summary": summary}) + "\n")
        started = time.perf_counter()
        manifest = record_view(read_record(Path(name), print), None)
        json_text(manifest.to_json())
        summary_frame(manifest.results, manifest.result_names).to_csv(index=False)
        return f"views of {count} images ({2 * count} results) from the record: {time.perf_counter() - started:.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="500,2000,10000", help="comma-separated image counts")
    sizes = [int(size) for size in parser.parse_args().sizes.split(",")]
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; vitcli run, predict + attend summary")
    print(views_cost(10_000))
    base = measure(BASELINE, report=False)
    print(f"fixed cost (a {BASELINE}-image run): {base['wall']:.1f} s wall, {base['cpu']:.1f} s CPU")
    header = f"{'images':>7} {'results':>8} {'wall s':>8} {'s/result':>9} {'CPU s/result':>13} {'written/result':>15}"
    header += f" {'vs files':>9}"
    print(header + f" {'records+views':>14} {'indexes':>9} {'peak MiB':>9}")
    rows, reports = [], []
    for size in sizes:
        row = measure(size, report=True)
        per_result = (row["wall"] - base["wall"]) / (row["results"] - base["results"])
        cpu_per_result = (row["cpu"] - base["cpu"]) / (row["results"] - base["results"])
        rows.append((per_result, cpu_per_result))
        print(
            f"{row['images']:>7} {row['results']:>8} {row['wall']:>8.1f} {per_result:>9.4f} {cpu_per_result:>13.4f} "
            f"{row['written'] / row['results']:>13.0f} B {row['written'] / row['result_bytes']:>8.2f}x "
            f"{row['run_bytes'] / row['results']:>12.0f} B {row['index_bytes'] / row['results']:>7.0f} B "
            f"{row['peak_mib']:>9.0f}",
            flush=True,
        )
        reports.append(
            f"report of {size} images: {row['report_wall']:.1f} s wall, {row['report_cpu']:.1f} s CPU, "
            f"peak {row['report_peak_mib']:.0f} MiB, index {row['report_index_bytes'] / 1e6:.2f} MB, "
            f"largest image page {row['report_largest_page'] / 1e3:.1f} kB"
        )
    print("\n".join(reports))
    wall_ratio, cpu_ratio = (rows[-1][index] / rows[0][index] for index in (0, 1))
    print(f"per result at {sizes[-1]} vs {sizes[0]}: wall {wall_ratio:.2f}x, CPU {cpu_ratio:.2f}x (goal <= 1.2x)")


if __name__ == "__main__":
    main()
