"""The one resolver of the class a command follows: a class given as an index or a label (one meaning for every
option that takes a class), the clean top-1 when none is given, and a contrast class. A target in embedding space
(--target-image, --target-direction, --target-feature, --target-text) is parsed in vitcli.targets and followed
through jobs.following.FollowsEmbedding instead; where one is given, no class is resolved.

Before weights load, `resolve_target_text` and `resolve_contrast` read the labels of a model's Architecture; with
the image's clean scores, `target_or_top1` and `resolve_target` fall back to the clean top-1.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vitcli.errors import UsageError
from vitcli.spec import ascii_number

if TYPE_CHECKING:
    from torch import Tensor


def resolve_class(labels: Sequence[str], text: str, option: str = "--target") -> int:
    """The class `text` names: an index, or a label matched case-insensitively (the whole label, then one of its
    comma-separated names, then a part of it); several matches or none are usage errors that list candidates."""
    cleaned = text.strip()
    index = ascii_number(cleaned)
    if index is not None:
        if index >= len(labels):
            raise UsageError(f"{option} {index} does not exist: class indexes are 0..{len(labels) - 1}")
        return index
    wanted = cleaned.casefold()
    folded = [label.casefold() for label in labels]
    stages = [
        [index for index, label in enumerate(folded) if label == wanted],
        [index for index, label in enumerate(folded) if wanted in (name.strip() for name in label.split(","))],
        [index for index, label in enumerate(folded) if wanted in label],
    ]
    for matches in stages:
        if len(matches) == 1:
            return matches[0]
        if matches:
            listed = "; ".join(f"{index} {labels[index]}" for index in matches[:10])
            more = f" and {len(matches) - 10} more" if len(matches) > 10 else ""
            raise UsageError(f"{option} {text!r} matches {len(matches)} classes: {listed}{more}; give the class index")
    close = difflib.get_close_matches(wanted, folded, n=3, cutoff=0.6)
    hint = "; close: " + "; ".join(f"{folded.index(c)} {labels[folded.index(c)]}" for c in close) if close else ""
    raise UsageError(f"{option} {text!r} matches no class label{hint}; give a label or an index 0..{len(labels) - 1}")


def resolve_contrast(labels: Sequence[str], text: str | None, target: int | None) -> int | None:
    """A --contrast text as a class index (None when not given), refused when it names the --target class: the metric
    logit(target) - logit(contrast) would be 0."""
    if text is None:
        return None
    contrast = resolve_class(labels, text, "--contrast")
    if contrast == target:
        raise UsageError(
            f"--contrast {text} is the target class {target}: logit(target) - logit(contrast) would be 0; "
            "choose another class"
        )
    return contrast


def resolve_target_text(named: Any, text: str | None) -> int | None:
    """A --target text as a class index of `named` (a model or its Architecture: anything with `labels`), before
    weights load; None keeps the clean top-1, known only per image."""
    return None if text is None else resolve_class(named.labels, text)


def target_or_top1(target: int | None, clean: Tensor) -> int:
    """The class to follow: `target`, or the clean top-1 when none is given (clean: the clean image's (classes,)
    logits or probabilities)."""
    return int(clean.argmax()) if target is None else target


def resolve_target(named: Any, text: str | None, clean: Tensor) -> int:
    """The class `text` names, or the clean top-1 when `text` is None (clean holds the clean image's scores)."""
    return target_or_top1(resolve_target_text(named, text), clean)
