"""Train the shapes model (vitcli.shapes_model) on scenes generated on the fly (vitcli.scenes): `make shapes-model`.

Step s trains on scenes s*B .. s*B+B-1 of the series --data-seed (kind "single"): every scene is new, so an "epoch"
is the whole run, one pass over steps*B scenes. AdamW with a linear warm-up then a cosine decay to zero; no dropout,
no augmentation (the generator varies everything but the shape). The held-out accuracy is measured on --eval-count
scenes of the series --eval-seed, which training never draws from.

Deterministic on a CPU: torch.manual_seed(--seed) sets the initial weights, torch.use_deterministic_algorithms(True)
and a fixed number of threads (--threads) fix the kernels, so two runs with the same arguments give the same weights
on one machine (tests/test_shapes_model.py checks a short run bitwise).

Writes, into --output-dir (default: vitcli/models, the shipped files): shapes.safetensors (fp16 weights; the
training record in its `vitcli` metadata), shapes.labels.txt (the class names) and shapes.json (the training
record: seeds, steps, scenes seen, settings, held-out accuracy, wall time, versions).

    python -m vitcli.shapes_training                       # the shipped model
    python -m vitcli.shapes_training --steps 20 --output-dir /tmp/shapes   # a quick try
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitcli import scenes, shapes_model

DATA_SEED = 1
EVAL_SEED = 9001  # held-out scenes: a series training never draws from
MODEL_SEED = 0


@dataclass(frozen=True)
class TrainingSettings:
    steps: int = 1500
    batch_size: int = 32
    learning_rate: float = 1e-3
    weight_decay: float = 0.05
    warmup_steps: int = 100
    data_seed: int = DATA_SEED
    model_seed: int = MODEL_SEED
    threads: int = 2
    eval_seed: int = EVAL_SEED
    eval_count: int = 1000


def batch(seed: int, start: int, count: int, kind: str = "single") -> tuple[torch.Tensor, torch.Tensor]:
    """Scenes start .. start+count-1 of series `seed` as the model's input (normalised as shapes_model says) and
    their labels."""
    drawn = [scenes.scene(seed, index, kind) for index in range(start, start + count)]
    images = torch.from_numpy(np.stack([item.image for item in drawn])).permute(0, 3, 1, 2)
    inputs = images.float().div_(255.0).sub_(shapes_model.MEAN[0]).div_(shapes_model.STD[0])
    return inputs, torch.tensor([item.label for item in drawn])


def learning_rate(step: int, settings: TrainingSettings) -> float:
    """Linear warm-up to the peak, then a cosine to zero at the last step."""
    if step < settings.warmup_steps:
        return settings.learning_rate * (step + 1) / settings.warmup_steps
    progress = (step - settings.warmup_steps) / max(1, settings.steps - settings.warmup_steps)
    return settings.learning_rate * 0.5 * (1 + math.cos(math.pi * progress))


def build(settings: TrainingSettings, **architecture: Any) -> torch.nn.Module:
    import timm

    shapes_model.register()
    torch.manual_seed(settings.model_seed)
    return timm.create_model(shapes_model.ARCHITECTURE, pretrained=False, **architecture)


def train(
    settings: TrainingSettings,
    report: Callable[[str], None] = lambda line: None,
    **architecture: Any,
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Train from scratch; returns the network (fp32, eval mode) and the training record."""
    torch.set_num_threads(settings.threads)
    torch.use_deterministic_algorithms(True)
    # Filling every new tensor with NaN (the deterministic mode's default) only guards against reading memory no
    # kernel wrote; it costs a fill per allocation, and these kernels write all they allocate.
    torch.utils.deterministic.fill_uninitialized_memory = False
    started = time.perf_counter()
    net = build(settings, **architecture)
    decay = [p for n, p in net.named_parameters() if p.ndim > 1 and "pos_embed" not in n]
    no_decay = [p for n, p in net.named_parameters() if not (p.ndim > 1 and "pos_embed" not in n)]
    optimiser = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.learning_rate,
    )
    net.train()
    running_loss, running_correct, seen = 0.0, 0, 0
    for step in range(settings.steps):
        for group in optimiser.param_groups:
            group["lr"] = learning_rate(step, settings)
        inputs, labels = batch(settings.data_seed, step * settings.batch_size, settings.batch_size)
        logits = net(inputs)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimiser.step()
        running_loss += loss.item() * len(labels)
        running_correct += int((logits.argmax(1) == labels).sum())
        seen += len(labels)
        if (step + 1) % 25 == 0 or step + 1 == settings.steps:
            elapsed = time.perf_counter() - started
            report(
                f"step {step + 1}/{settings.steps}  loss {running_loss / seen:.3f}  "
                f"train accuracy {running_correct / seen:.3f}  {elapsed:.0f} s"
            )
            running_loss, running_correct, seen = 0.0, 0, 0
    train_seconds = time.perf_counter() - started
    net.eval()
    accuracy = evaluate(net, settings.eval_seed, settings.eval_count)
    record = {
        "model": shapes_model.ARCHITECTURE,
        "classes": list(scenes.CLASS_NAMES),
        "data": f"vitcli.scenes, kind single, series {settings.data_seed}, scenes 0 to "
        f"{settings.steps * settings.batch_size - 1} (each seen once)",
        "epochs": 1,
        "scenes_seen": settings.steps * settings.batch_size,
        "settings": asdict(settings),
        "architecture": architecture
        or {
            "embed_dim": shapes_model.EMBED_DIM,
            "depth": shapes_model.DEPTH,
            "num_heads": shapes_model.HEADS,
            "mlp_ratio": shapes_model.MLP_RATIO,
        },
        "held_out": {"seed": settings.eval_seed, "count": settings.eval_count, "accuracy": accuracy},
        "train_seconds": round(train_seconds, 1),
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
    }
    return net, record


@torch.no_grad()
def evaluate(net: torch.nn.Module, seed: int, count: int, kind: str = "single", batch_size: int = 50) -> float:
    """The share of scenes 0 .. count-1 of series `seed` that `net` classifies right."""
    correct = 0
    for start in range(0, count, batch_size):
        inputs, labels = batch(seed, start, min(batch_size, count - start), kind)
        correct += int((net(inputs).argmax(1) == labels).sum())
    return correct / count


def save(net: torch.nn.Module, record: dict[str, Any], folder: Path) -> None:
    """shapes.safetensors (fp16, record in its metadata), shapes.labels.txt and shapes.json, each replaced whole."""
    from safetensors.torch import save_file

    from vitcli.weights import RECORD_KEY

    folder.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.detach().to(torch.float16).contiguous() for name, tensor in net.state_dict().items()}
    metadata = {RECORD_KEY: json.dumps({"shapes_training": record}, sort_keys=True)}
    _replace(folder / shapes_model.CHECKPOINT.name, lambda path: save_file(state, str(path), metadata=metadata))
    _replace(folder / shapes_model.LABELS.name, lambda path: path.write_text("\n".join(scenes.CLASS_NAMES) + "\n"))
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    _replace(folder / shapes_model.RECORD.name, lambda path: path.write_text(text))


def _replace(path: Path, write: Callable[[Path], None]) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> None:
    defaults = TrainingSettings()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for field, value in asdict(defaults).items():
        parser.add_argument(f"--{field.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--output-dir", type=Path, default=shapes_model.MODELS)
    parser.add_argument("--embed-dim", type=int, default=None, help="try another width (default: shapes_model's)")
    parser.add_argument("--depth", type=int, default=None)
    parser.add_argument("--num-heads", type=int, default=None)
    parser.add_argument("--mlp-ratio", type=float, default=None)
    arguments = vars(parser.parse_args(argv))
    output = arguments.pop("output_dir")
    chosen = {key: arguments.pop(key) for key in ("embed_dim", "depth", "num_heads", "mlp_ratio")}
    architecture = {key: value for key, value in chosen.items() if value is not None}
    settings = TrainingSettings(**arguments)
    net, record = train(settings, report=lambda line: print(line, flush=True), **architecture)
    save(net, record, output)
    print(f"held-out accuracy {record['held_out']['accuracy']:.4f} on {settings.eval_count} scenes; wrote {output}")


if __name__ == "__main__":
    main()
