"""A linear probe: new classes on the frozen model's features, from an ImageFolder (one subfolder per class).

The features are exactly what the model's head reads (`forward_head(pre_logits=True)`: the final normalized CLS row
for a CLS-readout checkpoint), so the fitted weights replace `head.weight` and `head.bias` (Swin's `head.fc`) and
the model's own forward gives the probe's logits. Features are cached by image SHA-256 in a dict the caller owns
and persists.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from vitcli.errors import UsageError, VitcliError
from vitcli.hashing import file_sha256
from vitcli.images import IMAGE_SUFFIXES
from vitcli.model import VitModel
from vitcli.spec import check_seed
from vitcli.weights import classifier_name

DEFAULT_WEIGHT_DECAY = 1e-4
MAX_ITERATIONS = 500


@dataclass
class ImageFolder:
    root: Path
    classes: list[str]  # subfolder names, sorted: class index = position
    paths: list[Path]  # every image, class by class, sorted within each class
    labels: list[int]  # class index of each path


@dataclass
class Features:
    sha256: list[str]  # per image
    features: Tensor  # (images, D) float32 on the CPU: the head's input for each image
    new: dict[str, Tensor]  # features computed in this call (SHA-256 -> feature), for the caller's cache
    reused: int  # images whose feature came from the cache


@dataclass
class LinearHead:
    weight: Tensor  # (classes, D)
    bias: Tensor  # (classes,)
    loss: float  # final training objective: mean cross-entropy + weight_decay / 2 * ||W||^2
    iterations: int


@dataclass
class ProbeImage:
    path: Path
    sha256: str
    label: int
    split: str  # "train" or "val"
    predicted: int
    probability: float  # the probe's probability of its predicted class


@dataclass
class ProbeResult:
    weights: str  # the backbone's weights label
    model_name: str
    root: Path
    classes: list[str]
    class_counts: list[int]
    seed: int
    val_fraction: float
    weight_decay: float
    head: LinearHead
    images: list[ProbeImage]
    train_accuracy: float
    val_accuracy: float | None  # None without a validation split
    evaluated_on: str  # "val", or "train" when there is no validation split
    confusion: list[list[int]]  # [true class][predicted class] over the evaluated split
    per_class_accuracy: list[float | None]  # over the evaluated split; None for a class with no image there
    new_features: int
    reused_features: int


def read_image_folder(root: Path) -> ImageFolder:
    """Classes are the subfolders holding images (any depth inside), sorted by name; at least two."""
    if not root.is_dir():
        raise VitcliError(f"{root} is not a folder: give an ImageFolder (one subfolder of images per class)")
    classes, paths, labels = [], [], []
    empty = []
    for folder in sorted(path for path in root.iterdir() if path.is_dir() and not path.name.startswith(".")):
        found = _images_inside(folder)
        if found:
            check_class_name(folder.name, root)
        if not found:
            empty.append(folder.name)
            continue
        labels.extend([len(classes)] * len(found))
        classes.append(folder.name)
        paths.extend(found)
    if len(classes) < 2:
        listed = f" (found {', '.join(classes)})" if classes else ""
        raise VitcliError(
            f"{root} needs at least two subfolders with images, one per class, such as dog/ and cat/{listed}"
            + (f"; without images: {', '.join(empty)}" if empty else "")
        )
    return ImageFolder(root, classes, paths, labels)


def _images_inside(folder: Path) -> list[Path]:
    """Every image under a class folder at any depth, sorted; links to files and to folders are followed (a folder
    reached twice, through a link cycle or two links, is read once)."""
    found, seen = [], set()
    for top, folders, files in os.walk(folder, followlinks=True):
        real = os.path.realpath(top)
        if real in seen:
            folders.clear()
            continue
        seen.add(real)
        found += [Path(top, name) for name in files if Path(name).suffix.lower() in IMAGE_SUFFIXES]
    return sorted(path for path in found if path.is_file())


def check_class_name(name: str, root: Path) -> None:
    """A folder name must survive the labels file (one name per line, surrounding spaces dropped) unchanged, so a
    probe never writes a checkpoint whose class names vitcli would read back differently or refuse."""
    shown = ascii(name)
    if not name.strip():
        raise UsageError(f"class folder {shown} in {root} has a name of only spaces: rename it (names become labels)")
    if name != name.strip():
        raise UsageError(
            f"class folder {shown} in {root} starts or ends with spaces, which the labels file drops: rename it"
        )
    breaks = [char for char in name if unicodedata.category(char) in ("Cc", "Zl", "Zp")]
    if breaks:
        raise UsageError(
            f"class folder {shown} in {root} holds a line break or control character (U+{ord(breaks[0]):04X}); "
            "class names are lines of the labels file: rename it"
        )


def _sha256(path: Path) -> str:
    """The cache key of one image: its SHA-256, or one line when the file cannot be read."""
    try:
        return file_sha256(path)
    except OSError as error:
        raise VitcliError(f"cannot read {path}: {error.strerror or error}") from error


def extract_features(
    model: VitModel,
    paths: list[Path],
    cached: dict[str, Tensor],
    on_progress: Callable[[int, int], None] | None = None,
) -> Features:
    """The head's input for every image, batched; images whose SHA-256 is in `cached` are not decoded or run.

    on_progress(done, total) is called after the cache look-up and after each batch.
    """
    hashes = [_sha256(path) for path in paths]
    missing = list(dict.fromkeys(digest for digest in hashes if digest not in cached))
    first_path: dict[str, Path] = {}
    for path, digest in zip(paths, hashes, strict=True):
        first_path.setdefault(digest, path)  # identical files are decoded and run once
    done = len(paths) - sum(1 for digest in hashes if digest not in cached)
    if on_progress:
        on_progress(done, len(paths))
    new: dict[str, Tensor] = {}
    for start in range(0, len(missing), model.batch_size):
        batch = missing[start : start + model.batch_size]
        inputs = torch.stack([model.prepare(first_path[digest]).input for digest in batch]).to(model.device)
        with torch.inference_mode():
            features = model.family.pooled(inputs).float().cpu()  # timm: forward_head(..., pre_logits=True)
        new.update(zip(batch, features, strict=True))
        done += sum(1 for digest in hashes if digest in batch)
        if on_progress:
            on_progress(done, len(paths))
    table = {**cached, **new}
    stacked = torch.stack([table[digest].float() for digest in hashes])
    return Features(hashes, stacked, new, len(paths) - sum(1 for digest in hashes if digest in new))


def split(labels: list[int], val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Train and validation indices, stratified: within each class a seeded permutation, round(n * fraction) to
    validation (at least one where the class has two or more images and the fraction is positive)."""
    if not 0.0 <= val_fraction < 1.0:
        raise UsageError(f"--val-fraction must be at least 0 and below 1, not {val_fraction}")
    check_seed("--split-seed", seed)
    generator = torch.Generator().manual_seed(seed)
    train, val = [], []
    for label in sorted(set(labels)):
        members = [index for index, value in enumerate(labels) if value == label]
        order = [members[i] for i in torch.randperm(len(members), generator=generator).tolist()]
        count = round(len(members) * val_fraction)
        if val_fraction > 0 and len(members) >= 2:
            count = min(max(count, 1), len(members) - 1)
        val.extend(order[:count])
        train.extend(order[count:])
    return sorted(train), sorted(val)


def fit_linear_head(
    features: Tensor, labels: Tensor, num_classes: int, weight_decay: float = DEFAULT_WEIGHT_DECAY
) -> LinearHead:
    """Multinomial logistic regression, full batch, L-BFGS in float64 from zeros: deterministic.

    Objective: mean cross-entropy + weight_decay / 2 * ||W||^2 (the bias is not decayed).
    """
    if weight_decay < 0:
        raise UsageError(f"--weight-decay must be at least 0, not {weight_decay}")
    x = features.double()
    weight = torch.zeros(num_classes, x.shape[1], dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(num_classes, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [weight, bias], lr=1.0, max_iter=MAX_ITERATIONS, tolerance_grad=1e-9, tolerance_change=1e-12,
        history_size=20, line_search_fn="strong_wolfe",
    )  # fmt: skip

    def objective() -> Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ weight.T + bias, labels) + weight_decay / 2 * weight.pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(objective)
        final = float(objective().detach())
    iterations = optimizer.state[weight].get("n_iter", 0)
    return LinearHead(weight.detach().float(), bias.detach().float(), final, int(iterations))


def run_probe(
    model: VitModel,
    folder: ImageFolder,
    cached: dict[str, Tensor],
    val_fraction: float = 0.2,
    seed: int = 0,
    weight_decay: float = DEFAULT_WEIGHT_DECAY,
    on_progress: Callable[[int, int], None] | None = None,
) -> tuple[ProbeResult, dict[str, Tensor]]:
    """Features (cached), a seeded split, the fitted head and its accuracies; also returns the new features."""
    train, val = split(folder.labels, val_fraction, seed)
    extracted = extract_features(model, folder.paths, cached, on_progress)
    labels = torch.tensor(folder.labels)
    head = fit_linear_head(extracted.features[train], labels[train], len(folder.classes), weight_decay)
    probabilities = (extracted.features @ head.weight.T + head.bias).softmax(-1)
    best = probabilities.max(-1)
    predicted = best.indices
    in_val = set(val)
    images = [
        ProbeImage(path, digest, label, "val" if index in in_val else "train", int(predicted[index]),
                   float(best.values[index]))
        for index, (path, digest, label) in enumerate(zip(folder.paths, extracted.sha256, folder.labels, strict=True))
    ]  # fmt: skip
    evaluated = val if val else train
    classes = len(folder.classes)
    confusion = [[0] * classes for _ in range(classes)]
    for index in evaluated:
        confusion[folder.labels[index]][int(predicted[index])] += 1
    per_class = [row[label] / sum(row) if sum(row) else None for label, row in enumerate(confusion)]
    result = ProbeResult(
        model.spec.label, model.name, folder.root, folder.classes,
        [folder.labels.count(label) for label in range(classes)], seed, val_fraction, weight_decay, head, images,
        _accuracy(predicted, labels, train), _accuracy(predicted, labels, val) if val else None,
        "val" if val else "train", confusion, per_class, len(extracted.new), extracted.reused,
    )  # fmt: skip
    return result, extracted.new


def _accuracy(predicted: Tensor, labels: Tensor, indices: list[int]) -> float:
    return float((predicted[indices] == labels[indices]).double().mean())


def adapted_checkpoint(model: VitModel, result: ProbeResult) -> tuple[dict[str, Tensor], list[str]]:
    """The model's state dict with the probe's head (backbone unchanged), and the class names in head order.

    A headless model (num_classes=0) gains a head. Every tensor is a contiguous CPU copy, as safetensors requires
    (it refuses shared storage).
    """
    state = {name: tensor.detach().cpu().contiguous().clone() for name, tensor in model.net.state_dict().items()}
    dtype = next(model.net.parameters()).dtype
    head = classifier_name(model.net)  # head on a ViT, head.fc on Swin
    state[f"{head}.weight"] = result.head.weight.to(dtype).contiguous().clone()
    state[f"{head}.bias"] = result.head.bias.to(dtype).contiguous().clone()
    return state, list(result.classes)
