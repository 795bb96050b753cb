"""What does going through vitcli cost? For each timm family, forwards per second through vitcli's model wrapper
(`VitModel.logits`) against the model's own `net(x)`, then the same with one site captured (capture.caching), random
weights, measured in one run. Goal (issue 28): vitcli / own >= 0.95 with nothing captured. Prints ratios; asserts
nothing about time (the machine is shared).

Each variant runs a few batches, interleaved over rounds (own, vitcli, captured, own, ...), and its fastest round
counts: on a shared machine the fastest round is the one a busy neighbour slowed least. Large models are cut to a
few blocks (same width, heads and pooling), which keeps the run short and vitcli's per-forward overhead as large a
share as it can be.

    .venv/bin/python benchmarks/families.py [--device cpu|cuda] [--batches 2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import timm
import torch

from vitcli.capture import caching, family_of
from vitcli.model import VitModel
from vitcli.spec import WeightsSpec

# (model, timm keyword arguments): one of each family and timm form
MODELS = [
    ("vit_tiny_patch16_224", {}),
    ("vit_base_patch16_siglip_224", {"depth": 3}),  # no CLS, attention pooling
    ("eva02_tiny_patch14_224", {}),
    ("deit_tiny_distilled_patch16_224", {}),
]
BATCH = 8


def per_second(forward: Callable[[torch.Tensor], torch.Tensor], inputs: torch.Tensor, batches: int) -> float:
    started = time.perf_counter()
    for _ in range(batches):
        forward(inputs)
    return batches * len(inputs) / (time.perf_counter() - started)


def measure(name: str, options: dict, device: torch.device, batches: int, rounds: int) -> str:
    torch.manual_seed(0)
    net = timm.create_model(name, pretrained=False, **options)
    try:
        family_of(net)
    except ValueError as error:
        return f"{name:34} skipped: {error}"
    model = VitModel(net, WeightsSpec(model_name=name, random=True), device, BATCH)
    middle = max(1, model.depth // 2)
    inputs = torch.randn(BATCH, *model.data_config["input_size"])

    def own(x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            output = model.net(x.to(device))
        if device.type == "cuda":
            torch.cuda.synchronize()
        return output

    def captured(site: str) -> Callable[[torch.Tensor], torch.Tensor]:
        def forward(x: torch.Tensor) -> torch.Tensor:
            with caching(model.net, [site]):
                return model.logits(x)

        return forward

    variants = {
        "own": own,
        "vitcli": model.logits,
        "resid_post": captured(f"blocks.{middle}.hook_resid_post"),
        "pattern": captured(f"blocks.{middle}.attn.hook_pattern"),
    }
    for forward in variants.values():  # warm-up: allocations, first-call costs
        forward(inputs)
    rates: dict[str, list[float]] = {key: [] for key in variants}
    for _ in range(rounds):
        for key, forward in variants.items():
            rates[key].append(per_second(forward, inputs, batches))
    best = {key: max(values) for key, values in rates.items()}
    cut = f" ({', '.join(f'{key}={value}' for key, value in options.items())})" if options else ""
    ratios = "  ".join(f"{key} {best[key] / best['own']:.3f}" for key in ("vitcli", "resid_post", "pattern"))
    return f"{name + cut:34} own {best['own']:7.1f}/s  vs own: {ratios}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    arguments = parser.parse_args()
    device = torch.device(arguments.device)
    print(
        f"forwards per second, batches of {BATCH} images, {arguments.batches} batches x {arguments.rounds} rounds "
        f"(the fastest), {device}, {torch.get_num_threads()} torch threads; ratios to the model's own net(x); "
        "resid_post / pattern: the middle block's site captured"
    )
    for name, options in MODELS:
        print(measure(name, options, device, arguments.batches, arguments.rounds), flush=True)


if __name__ == "__main__":
    main()
