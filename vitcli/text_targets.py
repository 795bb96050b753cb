"""Text targets (`--target-text T`, `--contrast-text U`): scale x cosine similarity of the image embedding and T's
text embedding (minus the same for U), read off the pooled embedding as every embedding target is (vitcli.targets).

On a CLIP model that is the zero-shot logit of T, computed as open_clip's own `model(image, text)` does. The options
are checked before any weights load: the model needs a text tower (capture.family FEATURES "text_tower"), the texts
must not be empty and must fit the tokenizer's context (vitcli.text_tower.TextLimits, from the model's name). Only
`bind_text` needs the loaded model (its TextTower).
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from vitcli.errors import UsageError

if TYPE_CHECKING:
    from torch import Tensor

    from vitcli.model import VitModel
    from vitcli.targets import EmbeddingTarget


def parse_text_target(text: str, contrast_text: str | None) -> dict[str, Any]:
    """The fields of the text target of --target-text and --contrast-text (vitcli.targets builds it), refused when a
    text is empty or both are the same."""
    for option, value in (("--target-text", text), ("--contrast-text", contrast_text)):
        if value is not None and not value.strip():
            raise UsageError(f"{option} is empty: give a text, such as 'a photo of a dog'")
    if contrast_text is not None and contrast_text.strip() == text.strip():
        raise UsageError(f"--contrast-text {contrast_text!r} is the target text: its score would be 0; give another")
    return {"text": text, "contrast_text": contrast_text, "sha256": text_sha256(text, contrast_text)}


def text_sha256(text: str, contrast_text: str | None) -> str:
    """A hash of the text(s): the result name carries its first characters, so distinct texts name distinct results."""
    return hashlib.sha256(json.dumps([text, contrast_text], ensure_ascii=False).encode("utf-8")).hexdigest()


def check_text_target(target: EmbeddingTarget, architecture: Any) -> None:
    """Refuse a text target on a model without a text tower, or a text longer than its tokenizer's context, before
    any weights load."""
    from vitcli.capture.support import TEXT_TOWER_FAMILIES
    from vitcli.text_tower import open_clip_text_limits
    from vitcli.tower_names import open_clip_name

    if "text_tower" not in architecture.features:
        raise UsageError(
            f"--target-text needs a model with a text tower, which {architecture.name} ({architecture.family}) lacks; "
            f"{TEXT_TOWER_FAMILIES} have one"
        )
    # The texts as given; put in --template's templates (the model's spec, which this check does not see) they are
    # checked again once the weights load, before any image (bind_text).
    limits = open_clip_text_limits(open_clip_name(architecture.name)[0])
    for option, text in (("--target-text", target.text), ("--contrast-text", target.contrast_text)):
        if text is not None:
            limits.check([text], option)


# ----- on the loaded model (torch from here on)


def bind_text(target: EmbeddingTarget, model: VitModel) -> tuple[EmbeddingTarget, Tensor]:
    """The text target on a loaded model: T's (and U's) unit text embedding, computed once by its text tower (put in
    --template's templates and averaged as zero-shot labels are, when the model was given some), with the tower's
    scale: the target naming the scale and the templates, and its vector (vitcli.targets binds them)."""
    import dataclasses

    from vitcli.capture.support import TEXT_TOWER_FAMILIES
    from vitcli.text_tower import fill

    tower = model.text
    if tower is None:
        raise UsageError(f"--target-text needs a model with a text tower; {TEXT_TOWER_FAMILIES} have one")
    texts = [target.text] if target.contrast_text is None else [target.text, target.contrast_text]
    templates = tuple(getattr(model.spec, "templates", ()) or ())
    for option, text in zip(("--target-text", "--contrast-text"), texts, strict=False):
        tower.check([fill(template, text) for template in templates] if templates else [text], option)
    embeddings = (tower.encode_labels(texts, templates) if templates else tower.encode(texts)).float().cpu()
    direction = embeddings[0] if len(texts) == 1 else embeddings[0] - embeddings[1]
    scale = float(tower.scale)
    return dataclasses.replace(target, scale=scale, templates=templates), scale * direction
