"""Named modules' first input and output during a forward: for views that follow every module of a network (trace),
beside the sites, which name the same places on every family."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from torch import Tensor, nn


@contextmanager
def module_inputs_and_outputs(net: nn.Module, names: Sequence[str]) -> Iterator[dict[str, tuple[Tensor, Tensor]]]:
    """name -> (first input, output) of each named submodule (as `net.named_modules()` names it) in the last forward
    inside the `with`; the very tensors the forward used. Read-only; hooks come off on leaving, whatever happens."""
    modules = dict(net.named_modules())
    unknown = [name for name in names if name not in modules]
    if unknown:
        raise KeyError(f"{type(net).__name__} has no module {unknown[0]!r}")
    kept: dict[str, tuple[Tensor, Tensor]] = {}
    removers: list[Callable[[], None]] = []

    def keeper(name: str) -> Callable[[nn.Module, tuple[Any, ...], Tensor], None]:
        def keep(_module: nn.Module, inputs: tuple[Any, ...], output: Tensor) -> None:
            kept[name] = (inputs[0], output)

        return keep

    try:
        for name in names:
            removers.append(modules[name].register_forward_hook(keeper(name)).remove)
        yield kept
    finally:
        for remove in reversed(removers):
            remove()
