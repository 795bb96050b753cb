"""How fast do `vitcli anatomy`'s image views run against plain forwards, and does cka's memory stay bounded?

One run measures, on a random-weight ViT-Tiny (the default architecture) and `--images` copies of one photo, already
preprocessed (decoding is the same for both and left out), each as the median of `--repeats` rounds that alternate:
  - anatomy: `measure(model, images, ["distance", "cka", "pca"])`, one forward per batch with the sites it reads;
  - plain: `VitModel.logits` of the same images in batches of the model's batch size;
and prints images per second for both and their ratio (the issue's goal: at least 0.8). Then cka alone over growing
numbers of images (`--counts`), with the peak of Python's traced allocations (numpy's arrays; torch's CPU tensors are
not traced) and the peak resident memory, and the ratio of each peak to the first count's: bounded means about 1.
Asserts nothing.

    .venv/bin/python benchmarks/anatomy.py
    .venv/bin/python benchmarks/anatomy.py --images 32 --counts 64,256,1024 --repeats 3
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import statistics
import time
import tracemalloc

import torch

from vitcli.experiments.anatomy_images import measure
from vitcli.images import sample_photo
from vitcli.loading import load_model
from vitcli.spec import WeightsSpec


def varied(image, seed: int):
    """The photo with a little seeded noise: distinct images (CKA of identical examples is undefined)."""
    generator = torch.Generator().manual_seed(seed)
    noise = 0.05 * torch.randn(image.input.shape, generator=generator)
    return dataclasses.replace(image, input=image.input + noise)


def plain(model, inputs: torch.Tensor) -> None:
    for start in range(0, len(inputs), model.batch_size):
        model.logits(inputs[start : start + model.batch_size])


def images_per_second(work, count: int, repeats: int) -> list[float]:
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        rates.append(count / (time.perf_counter() - started))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=16, help="images per timed round")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of each; the median is reported")
    parser.add_argument("--counts", default="32,128,256", help="image counts of the cka memory check")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    arguments = parser.parse_args()
    if arguments.threads:
        torch.set_num_threads(arguments.threads)
    model = load_model(WeightsSpec(random=True, seed=0), "cpu")
    image = model.prepare(sample_photo())
    images = [varied(image, seed) for seed in range(arguments.images)]
    inputs = torch.stack([prepared.input for prepared in images])
    plain(model, inputs[:2])  # warm up both paths
    measure(model, images[:4], ["distance", "cka", "pca"])
    anatomy_rates, plain_rates = [], []
    for _ in range(arguments.repeats):  # alternate, so a busy machine hurts both alike
        anatomy_rates += images_per_second(lambda: measure(model, images, ["distance", "cka", "pca"]), len(images), 1)
        plain_rates += images_per_second(lambda: plain(model, inputs), len(images), 1)
    anatomy_rate, plain_rate = statistics.median(anatomy_rates), statistics.median(plain_rates)
    threads = torch.get_num_threads()
    print(f"{model.name}, random weights, {len(images)} images, batch {model.batch_size}, {threads} threads")
    ratio = anatomy_rate / plain_rate
    print(f"distance+cka+pca: {anatomy_rate:.1f} images/s; plain forwards: {plain_rate:.1f} images/s", end="")
    print(f"; ratio {ratio:.2f} (goal >= 0.8)")
    print("cka memory by image count (peaks: traced Python/numpy allocations, process resident set):")
    first = None
    for count in (int(text) for text in arguments.counts.split(",")):
        lazy = (varied(image, seed) for seed in range(count))  # a stream: no list of images held
        tracemalloc.start()
        started = time.perf_counter()
        result = measure(model, lazy, ["cka"])
        seconds = time.perf_counter() - started
        traced = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        resident = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        first = first or (traced, resident)
        print(
            f"  {count:6d} images ({result.cka.minibatches} minibatches): traced peak {traced / 2**20:8.2f} MiB "
            f"(x{traced / first[0]:.2f}), resident peak {resident / 2**20:8.1f} MiB (x{resident / first[1]:.2f}), "
            f"{count / seconds:.1f} images/s"
        )


if __name__ == "__main__":
    main()
