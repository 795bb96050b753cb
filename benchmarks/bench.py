"""How long does `vitcli bench` take per image, per method? Seconds per image of each method alone, with the chosen
scores, over N generated scenes (vitcli.scenes), for each N of --images.

One process: the model (random-weight ViT-Tiny by default) loads once; the scenes are written once to a temporary
folder; then for each method, bench's own Job (vitcli.jobs.bench) computes every image, timed per image (the clean
forward included, as the runner shares it per batch of images). Files are not written: the store's cost is the same
for every method. Prints a table (method, images, median and mean seconds per image), asserts nothing.

    .venv/bin/python benchmarks/bench.py                                  # 10 and 100 scenes, every score
    .venv/bin/python benchmarks/bench.py --images 10 --scores pointing,mass,deletion,insertion
    .venv/bin/python benchmarks/bench.py --images 3 --method gradcam --method edge --threads 2

Measured on 2 shared CPU cores (load about 7), one thread, `--images 10 --scores pointing,mass,deletion,insertion`,
median seconds per image: relevance 5.7, grad-rollout 4.0, gradcam 4.3, attention 3.7, rollout 5.9, occlusion 25.5,
ig 6.6, smoothgrad 3.4, gradient 2.0, random 1.4, edge 1.3. The other scores per method and the maps alone:
docs/commands/bench.md ("Cost"). 100 images were not measured there: a method's cost per image does not depend on N.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from vitcli.errors import UsageError
from vitcli.images import resolve_images
from vitcli.jobs import ImageWork
from vitcli.jobs.bench import BENCH_METHODS, bench_jobs
from vitcli.loading import describe, load_model
from vitcli.scenes import write_folder
from vitcli.spec import WeightsSpec


def seconds_per_image(model, architecture, paths: list[Path], method: str, scores: str, masks: Path) -> list[float]:
    (job,) = bench_jobs(method=[method], scores=scores, masks=masks)
    try:
        job = job.plan(architecture)
    except UsageError:  # no method of the job runs on the model
        return []
    times = []
    for path in paths:
        start = time.perf_counter()
        job.compute(ImageWork(model, model.prepare(path)))
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--method", action="append", choices=BENCH_METHODS)
    parser.add_argument("--scores", default="all")
    parser.add_argument("--model", default="vit_tiny_patch16_224.augreg_in21k_ft_in1k")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    spec = WeightsSpec(model_name=arguments.model, random=True, seed=0)
    model = load_model(spec, "cpu")
    architecture = describe(spec)
    methods = arguments.method or list(BENCH_METHODS)
    print(f"{arguments.model} (random weights), {arguments.threads} threads, scores {arguments.scores}")
    print(f"{'method':<14} {'images':>6} {'median s/image':>15} {'mean s/image':>13}")
    with tempfile.TemporaryDirectory() as folder:
        for count in arguments.images:
            root = Path(folder) / f"n{count}"
            write_folder(root, arguments.seed, count)
            paths = resolve_images([str(root)])
            for method in methods:
                times = seconds_per_image(model, architecture, paths, method, arguments.scores, root / "masks")
                if not times:
                    print(f"{method:<14} {count:>6} {'cannot run':>15}")
                    continue
                print(f"{method:<14} {count:>6} {statistics.median(times):>15.3f} {statistics.mean(times):>13.3f}")


if __name__ == "__main__":
    main()
