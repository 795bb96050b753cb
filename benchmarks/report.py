"""How `vitcli report` scales: a generated run folder of N images (three results each: predict, patches with a
figure, occlude-patches with 196 covers; written through vitcli's own output store, with a manifest.json of the
schema vitcli.batch.manifest reads), then `vitcli report` on it in a subprocess.

Prints the build's wall time and CPU time (the machine is shared: wall time depends on its load, printed beside it),
its peak memory (the child's maximum resident set), the index page's size and its bytes per image (so the size at
10,000 images), and the largest page of one image. Goals (issue 19): 2,000 images in
under a minute and under 1 GB; the index under 5 MB at 10,000 images; one image's page under 3 MB.

    .venv/bin/python benchmarks/report.py [IMAGES]   (default 2000)
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from vitcli.batch.manifest import Manifest
from vitcli.store import OutputStore, ResultFiles

VITCLI = str(Path(sys.executable).parent / "vitcli")
MODEL = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
OCCLUSION_COLUMNS = "target_class,target_label,clean_probability,cover,patch,row,col,left,top,right,bottom,"
OCCLUSION_COLUMNS += "target_probability,drop_points,top1_class,top1_label"


def figure_bytes(seed: int, size: int = 160) -> bytes:
    """A PNG of noise, about the size a small figure compresses to (noise does not compress)."""
    pixels = np.random.default_rng(seed).integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def fake_run(root: Path, count: int, name: str = "bench") -> Path:
    """ROOT/NAME: a run folder of `count` images as `vitcli run` leaves it; returns the run folder."""
    run = root / name
    store = OutputStore(run)
    figure = figure_bytes(0)
    rng = np.random.default_rng(1)
    results = []
    for number in range(count):
        image = f"/photos/image{number:05d}.png"
        sha = hashlib.sha256(image.encode()).hexdigest()
        folder = store.folder(MODEL, f"image{number:05d}-{sha[:8]}")
        probability = float(rng.random())
        drops = rng.normal(0, 5, 196)
        top = "rank,index,label,probability,logit\n" + "".join(
            f"{k},{k * 7},class {k},0.{9 - k},{k}.5\n" for k in (1, 2, 3)
        )
        covers = (
            OCCLUSION_COLUMNS
            + "\n"
            + "".join(
                f"3,tabby,{probability:.6f},P{p},P{p},{(p - 1) // 14},{(p - 1) % 14},0,0,16,16,0.1,"
                f"{float(drop)!r},3,tabby\n"
                for p, drop in enumerate(drops, start=1)
            )
        )
        written = {
            ("predict-k3", "predict", "predict"): {"csv": top, "json": "{}"},
            ("patches-p63-v4", "patches", "patches"): {"png": figure, "csv": "patch,row,col\nP63,4,6\n"},
            ("occlude-patches-w1", "occlude-patches", "occlusion"): {"csv": covers, "json": "{}"},
        }
        summaries = {
            "predict": {
                "predict_top1_class": 3,
                "predict_top1_label": "tabby",
                "predict_top1_probability": probability,
            },
            "patches": {"patches_projection_max_difference": float(rng.random()) * 1e-6},
            "occlude-patches": {
                "occlusion_largest_drop_points": float(drops.max()),
                "occlusion_largest_drop_patch": f"P{int(drops.argmax()) + 1}",
                "occlusion_lowered": int((drops > 0).sum()),
                "occlusion_raised": int((drops < 0).sum()),
            },
        }
        for (experiment, command, _), files in written.items():
            paths = store.write(folder, ResultFiles(experiment, files))
            results.append({
                "image": image, "image_sha256": sha, "subject": image, "experiment": experiment, "command": command,
                "settings": {}, "files": [str(path.relative_to(run)) for path in paths],
                "compute_seconds": 0.1, "write_seconds": 0.01, "summary": summaries[command],
            })  # fmt: skip
    provenance = {"model": MODEL, "weights_label": "RANDOM (seed 0)", "weights": {"source": "random", "seed": 0}}
    manifest = Manifest(name, "identity", {"name": name}, provenance, None, results, [])
    (run / "manifest.json").write_text(json.dumps(manifest.to_json()), encoding="utf-8")
    return run


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        run = fake_run(Path(folder), count)
        print(f"generated a run of {count} images in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        subprocess.run([VITCLI, "report", str(run), "-q"], check=True)
        seconds = time.perf_counter() - started
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        peak, cpu = usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime  # ru_maxrss is in kB on Linux
        index = (run / "report.html").stat().st_size
        pages = [path.stat().st_size for path in run.glob(f"{MODEL}/*/report.html")]
        load = os.getloadavg()[0]
        print(
            f"report of {count} images: {seconds:.1f} s ({cpu:.1f} s of CPU; load average {load:.1f}), "
            f"peak memory {peak:.0f} MB"
        )
        print(
            f"index {index / 1e6:.2f} MB ({index / count:.0f} bytes per image: "
            f"{index / count * 1e4 / 1e6:.1f} MB at 10,000)"
        )
        print(f"{len(pages)} image pages, largest {max(pages) / 1e3:.1f} kB")


if __name__ == "__main__":
    main()
