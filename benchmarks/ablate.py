"""How fast does `vitcli ablate` run, against the same number of plain batched forwards?

One run measures, on a random-weight ViT-Tiny (the default architecture) and one photo, each as the median of
`--repeats` runs (rounds alternate the two, so a busy machine hurts both alike):
  - ablate: `ablate(...)` with every head (36) and, with --blocks, every sublayer (24 more) zero-ablated: the clean
    forward that keeps the residual rows, then batches of `--batch-size` ablations, each from the rows entering its
    earliest ablated block;
  - plain: the model's own forward of as many copies of the image as there are ablations, through
    `VitModel.logits` (batches of `--batch-size`, two streams on a CPU with two or more threads);
and prints ablations per second for both and their ratio (the goal: ablate at least 0.8 of plain). Asserts nothing.

    .venv/bin/python benchmarks/ablate.py
    .venv/bin/python benchmarks/ablate.py --blocks --repeats 5 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from vitcli.experiments.ablation import ATTENTION, HEAD, MLP, Ablation, Replacements, ablate
from vitcli.images import sample_photo
from vitcli.loading import load_model
from vitcli.spec import WeightsSpec

ROOT = Path(__file__).resolve().parents[1]
PHOTO = ROOT / "examples" / "images" / "newfoundland_31.jpg"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--image", type=Path, default=PHOTO if PHOTO.is_file() else sample_photo())
    parser.add_argument("--batch-size", type=int, default=None, help="default: vitcli's for the device")
    parser.add_argument("--blocks", action="store_true", help="ablate every sublayer too")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    arguments = parser.parse_args()
    if arguments.threads is not None:
        torch.set_num_threads(arguments.threads)

    model = load_model(WeightsSpec(random=True, seed=0), arguments.device, arguments.batch_size)
    prepared = model.prepare(arguments.image)
    ablations = [Ablation(b, HEAD, h) for b in range(1, model.depth + 1) for h in range(1, model.num_heads + 1)]
    if arguments.blocks:
        ablations += [Ablation(b, site) for b in range(1, model.depth + 1) for site in (ATTENTION, MLP)]
    copies = prepared.input.unsqueeze(0).expand(len(ablations), -1, -1, -1).contiguous()
    actions = {
        "ablate": lambda: ablate(model, prepared, ablations, Replacements("zero"), None),
        "plain": lambda: model.logits(copies),
    }
    times: dict[str, list[float]] = {name: [] for name in actions}
    for action in actions.values():
        action()  # warm-up: first calls allocate and pick kernels
    for _ in range(arguments.repeats):
        for name, action in actions.items():
            start = time.perf_counter()
            action()
            times[name].append(time.perf_counter() - start)
    rates = {name: len(ablations) / statistics.median(seconds) for name, seconds in times.items()}
    print(
        f"{model.name} on {model.device}, {torch.get_num_threads()} threads, batch size {model.batch_size}, "
        f"{len(ablations)} ablations, median of {arguments.repeats}"
    )
    print(f"ablate: {rates['ablate']:.1f} ablations/s (clean forward included)")
    print(f"plain:  {rates['plain']:.1f} forwards/s")
    print(f"ratio ablate / plain: {rates['ablate'] / rates['plain']:.2f} (goal: at least 0.8)")


if __name__ == "__main__":
    main()
