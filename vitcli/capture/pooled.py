"""The forward ending at the pooled embedding: what embedding targets (vitcli.targets) score, on any family."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from vitcli.capture.family import Family


@contextmanager
def pooled_output(family: Family) -> Iterator[None]:
    """Inside the `with`, every forward of the family's net (the whole forward, a forward from a block on, batched or
    hooked) outputs the pooled embedding (B, D) instead of the logits: each classifier head hands back its input.
    A headless net already ends there. Equal to `family.pooled` (tests hold it so)."""
    if family.num_classes == 0:
        yield
        return
    head = family.model_tap("head.hook_in").module
    # A distilled DeiT averages two heads (CLS and DIST rows): both pass their rows through, as pre_logits does.
    heads = [head, *([family.net.head_dist] if hasattr(family.net, "head_dist") else [])]
    handles = [module.register_forward_hook(lambda _module, inputs, _output: inputs[0]) for module in heads]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
