"""Forward latency and peak memory of patch-size variants (random init) on a device."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

from vitcli.experiments.patch_size_variants import Variant, build_variant, pad_to_patches

CUDA_MEMORY_METHOD = (
    "torch.cuda.max_memory_allocated during one forward minus the memory allocated before it (CUDA caching allocator)"
)
TENSOR_MEMORY_METHOD = (
    "largest total size of tensors created during one forward and alive at the same time, sampled after every aten "
    "operator (weights and input excluded; scratch buffers inside a kernel are not seen)"
)


@dataclass(frozen=True)
class Measurement:
    batch_size: int
    runs: int
    warmup: int
    latencies_ms: list[float]  # each run's wall time for the whole batch
    peak_memory_bytes: int
    memory_method: str

    @property
    def latency_ms_per_image(self) -> float:
        return statistics.median(self.latencies_ms) / self.batch_size


@dataclass(frozen=True)
class MeasureSettings:
    device: torch.device
    batch_size: int
    runs: int
    warmup: int
    seed: int


def measure_variants(
    variants: list[Variant], settings: MeasureSettings, progress: Callable[[str], None]
) -> list[Measurement]:
    """Median forward wall time of each variant over `runs` after `warmup` forwards, and the peak memory of one
    more forward. The timed runs take turns (variant 1, 2, 3, 1, 2, 3, ...) so that other load on the machine
    falls on every variant alike rather than on whichever happened to run during it."""
    device, batch = settings.device, settings.batch_size
    torch.manual_seed(settings.seed)
    nets = [build_variant(variant, device) for variant in variants]
    size = variants[0].image_size
    images = torch.randn(
        batch, variants[0].dimensions.in_chans, size, size, generator=torch.Generator().manual_seed(settings.seed)
    )
    inputs = [pad_to_patches(images, variant.patch_size).to(device) for variant in variants]
    latencies: list[list[float]] = [[] for _ in variants]
    with torch.inference_mode():
        for net, batch_input in zip(nets, inputs, strict=True):
            for _ in range(settings.warmup):
                net(batch_input)
        for run in range(settings.runs):
            progress(f"timing run {run + 1} of {settings.runs} (batch {batch}, every variant) on {device} ...")
            for times, net, batch_input in zip(latencies, nets, inputs, strict=True):
                _synchronize(device)
                start = time.perf_counter()
                net(batch_input)
                _synchronize(device)
                times.append((time.perf_counter() - start) * 1000)
        peaks = [peak_forward_memory(net, batch_input, device) for net, batch_input in zip(nets, inputs, strict=True)]
    return [
        Measurement(batch, settings.runs, settings.warmup, times, peak, method)
        for times, (peak, method) in zip(latencies, peaks, strict=True)
    ]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def peak_forward_memory(net: nn.Module, inputs: Tensor, device: torch.device) -> tuple[int, str]:
    """Peak bytes one forward needs beyond what was allocated before it, and how it was measured."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        net(inputs)
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before, CUDA_MEMORY_METHOD
    with LiveTensorPeak() as tracker:
        net(inputs)
    return tracker.peak_bytes, TENSOR_MEMORY_METHOD


class LiveTensorPeak(TorchDispatchMode):
    """Tracks the storages that aten operators create and the largest total of them alive at once.

    torch has no peak-memory statistic for the CPU allocator, and the process RSS high-water mark cannot be reset
    and hides reuse of freed pages; weak references to storages see exactly the tensors the forward creates.
    """

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, tuple[Any, int]] = {}
        self.peak_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.multiprocessing.reductions import StorageWeakRef
        from torch.utils._pytree import tree_leaves

        result = func(*args, **(kwargs or {}))
        # Drop freed storages first: a new output may reuse a freed address.
        self._live = {address: entry for address, entry in self._live.items() if not entry[0].expired()}
        for tensor in tree_leaves(result):
            if isinstance(tensor, Tensor):
                storage = tensor.untyped_storage()
                self._live.setdefault(storage.data_ptr(), (StorageWeakRef(storage), storage.nbytes()))
        self.peak_bytes = max(self.peak_bytes, sum(nbytes for _, nbytes in self._live.values()))
        return result
