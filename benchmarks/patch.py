"""How fast is `vitcli patch --sites residual` (blocks x tokens patched forwards) against plain batched forwards?

For a random-weight ViT-Tiny (the default architecture) and the lecture's dog/cat pair: every `--every`-th residual
site (block-major, so every block is sampled alike) patched by `patched_metric` at the model's batch size, then the
same number of plain batched forwards of the model (`net(x)`, no hooks), back to back, best of `--repeats`. Prints
sites per second, forwards per second and their ratio; the attribution estimate (2 forwards + 1 backward) is timed
beside them. Patched runs start at the earliest block of their batch, so they can beat a whole forward.

    .venv/bin/python benchmarks/patch.py                 # every 4th site (591 of 2,364)
    .venv/bin/python benchmarks/patch.py --every 1       # all 2,364
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from vitcli.experiments.patching import patched_metric, run_pair, sites_of
from vitcli.loading import load_model
from vitcli.spec import WeightsSpec

IMAGES = Path(__file__).resolve().parents[1] / "examples" / "images"


def best_seconds(action, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--every", type=int, default=4, help="patch every N-th residual site")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    model = load_model(WeightsSpec(random=True, seed=0), "cpu")
    clean, corrupt = (model.prepare(IMAGES / name) for name in ("newfoundland_31.jpg", "Persian_98.jpg"))
    pair = run_pair(model, clean.input, corrupt.input)
    sites = sites_of("residual", model.depth, model.grid.num_tokens, model.num_heads)[:: arguments.every]
    inputs = corrupt.input.unsqueeze(0).expand(model.batch_size, -1, -1, -1).contiguous()
    batches = -(-len(sites) // model.batch_size)

    def plain() -> None:
        with torch.inference_mode():
            for _ in range(batches):
                model.net(inputs)

    print(
        f"{os.cpu_count()} CPUs, {arguments.threads} torch threads, load average {os.getloadavg()[0]:.1f}; "
        f"{len(sites)} of {model.depth * model.grid.num_tokens} residual sites, batch size {model.batch_size}"
    )
    patched = best_seconds(lambda: patched_metric(model, pair, sites), arguments.repeats)
    forwards = best_seconds(plain, arguments.repeats)
    attribution = best_seconds(lambda: run_pair(model, clean.input, corrupt.input, gradients=True), arguments.repeats)
    plain_count = batches * model.batch_size
    print(f"residual patching: {len(sites) / patched:8.1f} sites/s ({patched:.2f} s)")
    print(f"plain forwards:    {plain_count / forwards:8.1f} forwards/s ({forwards:.2f} s for {plain_count})")
    print(f"ratio (patched sites/s over plain forwards/s): {(len(sites) / patched) / (plain_count / forwards):.2f}")
    print(f"attribution estimate (2 forwards + 1 backward, every site): {attribution:.3f} s")
    print(
        f"all {model.depth * model.grid.num_tokens} residual sites would take about "
        f"{model.depth * model.grid.num_tokens / (len(sites) / patched):.0f} s at this rate"
    )


if __name__ == "__main__":
    main()
