"""How long do `vitcli explain --method relevance` and the faithfulness curves take, against a forward pass?

One run measures, on a random-weight ViT-Tiny (the default architecture) and one photo:
  - the forward only: the model's own (fused) forward of one image, and of one batch of `batch_size` images;
  - relevance: `explain(..., ["relevance"])`, that is the clean forward for the target, the hooked forward and
    backward with the fused attention off, the self-check forward and the relevance rule;
  - the faithfulness curves of that map (and of `--random-orders` random orders) with `--steps` steps;
each as the median of `--repeats` runs, with its ratio to the one-image forward; and Integrated Gradients
(`--ig-steps` points, gray baseline) by vitcli against captum's IntegratedGradients with the same method
(riemann_trapezoid) and internal batch size (`batch_size`), in this one process, run alternately, with their ratio.
It prints, asserts nothing.

    .venv/bin/python benchmarks/explain.py
    .venv/bin/python benchmarks/explain.py --steps 196 --random-orders 10 --threads 1
    .venv/bin/python benchmarks/explain.py --ig-only --repeats 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from vitcli.experiments.explain import explain
from vitcli.experiments.faithfulness import FaithfulnessOptions, count_forwards, faithfulness
from vitcli.experiments.gradients import integrated_gradients
from vitcli.experiments.occlusion import fill_image
from vitcli.images import sample_photo
from vitcli.loading import load_model
from vitcli.spec import WeightsSpec

ROOT = Path(__file__).resolve().parents[1]
LECTURE_PHOTO = ROOT.parent / "shared" / "data" / "newfoundland_31.jpg"


def median_seconds(action: Callable[[], object], repeats: int) -> float:
    action()  # warm-up: first calls allocate and pick kernels
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--image", type=Path, default=LECTURE_PHOTO if LECTURE_PHOTO.is_file() else sample_photo())
    parser.add_argument("--steps", type=int, default=49)
    parser.add_argument("--random-orders", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--ig-steps", type=int, default=32)
    parser.add_argument("--ig-only", action="store_true", help="only the Integrated Gradients comparison")
    arguments = parser.parse_args()

    torch.set_num_threads(arguments.threads)
    model = load_model(WeightsSpec(random=True, seed=0), arguments.device)
    prepared = model.prepare(arguments.image)
    one = prepared.input[None]
    batch = one.expand(model.batch_size, *one.shape[1:]).clone()
    print(
        f"{os.cpu_count()} CPUs, {arguments.threads} torch thread(s), device {model.device}, torch {torch.__version__};"
        f" load average {os.getloadavg()[0]:.1f}; image {arguments.image.name}; batch size {model.batch_size}"
    )
    if arguments.ig_only:
        target = int(model.logits(one)[0].argmax())
        compare_integrated_gradients(model, prepared, target, arguments.ig_steps, arguments.repeats)
        return

    forward = median_seconds(lambda: model.logits(one), arguments.repeats)
    batched = median_seconds(lambda: model.logits(batch), arguments.repeats) / model.batch_size
    relevance = median_seconds(lambda: explain(model, prepared, ["relevance"]), arguments.repeats)

    result = explain(model, prepared, ["relevance"])
    maps = {"relevance": result.maps[0].values}
    options = FaithfulnessOptions(arguments.steps, arguments.random_orders)
    fill = fill_image(model, prepared, "gray")
    forwards = count_forwards(len(maps), options)

    def curves() -> object:
        return faithfulness(model, prepared.input, fill, maps, result.target.index, options)

    curve_seconds = median_seconds(curves, max(1, arguments.repeats // 2))

    print(f"\n{'what':84} {'seconds':>9} {'x forward':>10}")
    rows = [
        ("forward only, one image (the model's own fused forward)", forward),
        (f"forward only, per image in a batch of {model.batch_size}", batched),
        ("explain --method relevance (clean forward + hooked forward/backward + self-check)", relevance),
        (
            f"faithfulness curves: relevance + {arguments.random_orders} random orders, {arguments.steps} steps "
            f"({forwards} forwards)",
            curve_seconds,
        ),
        ("  the same, per forward", curve_seconds / forwards),
    ]
    for name, seconds in rows:
        print(f"{name:84} {seconds:9.4f} {seconds / forward:10.2f}")
    print(f"self-check of the hooked forward: max |logits - eval forward| {result.output_difference:.2g}")
    compare_integrated_gradients(model, prepared, result.target.index, arguments.ig_steps, arguments.repeats)


def compare_integrated_gradients(model, prepared, target: int, steps: int, repeats: int) -> None:
    """vitcli's IG against captum's on the same model, image, baseline, steps and internal batch size, alternating."""
    from captum.attr import IntegratedGradients

    baseline = fill_image(model, prepared, "gray")

    def ours() -> object:
        return integrated_gradients(model, prepared.input, baseline, target, None, steps)

    captum = IntegratedGradients(model.net)

    def theirs() -> object:
        attribution = captum.attribute(
            prepared.input[None].to(model.device),
            baselines=baseline[None].to(model.device),
            target=target,
            n_steps=steps,
            method="riemann_trapezoid",
            internal_batch_size=model.batch_size,
        )
        model.net.zero_grad(set_to_none=True)
        return attribution

    ours(), theirs()  # warm-up
    timings: dict[str, list[float]] = {"vitcli": [], "captum": []}
    for _ in range(repeats):
        for name, action in (("vitcli", ours), ("captum", theirs)):
            start = time.perf_counter()
            action()
            timings[name].append(time.perf_counter() - start)
    vitcli_seconds, captum_seconds = (statistics.median(timings[name]) for name in ("vitcli", "captum"))
    print(
        f"\nIntegrated Gradients, {steps} steps, internal batch {model.batch_size}, median of {repeats} alternating: "
        f"vitcli {vitcli_seconds:.3f} s, captum {captum_seconds:.3f} s, ratio {vitcli_seconds / captum_seconds:.2f}"
    )


if __name__ == "__main__":
    main()
