"""Zero-shot classification: an image-text model becomes a classifier whose head is made of label texts.

The head reads the image embedding e and holds one unit vector t_c per label (CLIP's recipe: the mean of the label's
template embeddings, renormalized): logit_c = scale * cos(e, t_c) (+ bias, SigLIP). Probabilities as the model
defines them: CLIP a softmax over the labels, SigLIP an independent sigmoid per label. Installed as the net's
classifier head, so predict and every command taking --target NAME run on the labels with no other change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F  # noqa: N812  (the usual name)
from torch import Tensor, nn

from vitcli.capture import family_of
from vitcli.errors import UsageError, VitcliError
from vitcli.spec import WeightsSpec
from vitcli.text_tower import PLACEHOLDER, TextTower, fill


class ZeroShotHead(nn.Module):
    """scale * normalize(embedding) @ labels^T (+ bias): the zero-shot logits of the label embeddings `weight`."""

    reads_texts = True  # not a Linear layer: commands that read a head's weights refuse it ("linear_head")

    def __init__(self, weight: Tensor, scale: float, bias: float | None):
        super().__init__()
        self.register_buffer("weight", weight.float().clone())  # (labels, D) unit rows
        self.scale = scale
        self.bias = bias

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

    def forward(self, embedding: Tensor) -> Tensor:
        logits = self.scale * F.normalize(embedding, dim=-1) @ self.weight.to(embedding.dtype).T
        return logits if self.bias is None else logits + self.bias


@dataclass(frozen=True)
class ZeroShot:
    """What a zero-shot classifier's outputs say about themselves."""

    labels: tuple[str, ...]
    templates: tuple[str, ...]
    kind: str  # "softmax" or "sigmoid"
    scale: float
    bias: float | None

    def probabilities(self, logits: Tensor) -> Tensor:
        return logits.sigmoid() if self.kind == "sigmoid" else logits.softmax(dim=-1)

    def describe(self) -> dict[str, Any]:
        definition = "softmax over the labels of scale * cos(image, label)"
        if self.kind == "sigmoid":
            definition = "sigmoid per label of scale * cos(image, label) + bias"
        return {
            "labels": list(self.labels),
            "templates": list(self.templates),
            "probabilities": self.kind,
            "definition": definition,
            "scale": self.scale,
            "bias": self.bias,
            "label_embedding": "per label, the mean of its templates' unit text embeddings, renormalized",
        }


def refuse_templates(spec: WeightsSpec) -> None:
    """--template on a model without a text tower: exit 2 naming the models that have one."""
    from vitcli.capture.support import TEXT_TOWER_FAMILIES

    if spec.templates:
        raise UsageError(
            f"--template needs a text tower, which {spec.model_name} lacks; {TEXT_TOWER_FAMILIES} have one"
        )


def spec_labels(spec: WeightsSpec) -> tuple[str, ...] | None:
    """The labels a spec names (--labels list, or the file of --labels/--labels-file), or None."""
    from vitcli.classes import read_labels

    if spec.label_names is not None:
        return spec.label_names
    if spec.labels is None:
        return None
    if not spec.labels.is_file():
        raise VitcliError(f"labels file not found: {spec.labels}")
    return read_labels(spec.labels)


def check_texts(spec: WeightsSpec, labels: tuple[str, ...]) -> None:
    """Before the weights load: every label in every template fits the tokenizer's context (exit 2 naming it)."""
    from vitcli.text_tower import open_clip_text_limits
    from vitcli.tower_names import open_clip_name

    templates = spec.templates or (PLACEHOLDER,)
    limits = open_clip_text_limits(open_clip_name(spec.model_name)[0])
    limits.check([fill(template, label) for label in labels for template in templates], "--labels")


def install(model: Any, labels: tuple[str, ...], text: TextTower) -> None:
    """Make `model` (a VitModel with a text tower) a zero-shot classifier of `labels`, its head on its net."""
    templates = model.spec.templates or (PLACEHOLDER,)  # their lengths were checked before loading (check_texts)
    head = ZeroShotHead(text.encode_labels(labels, templates), text.scale, text.bias).to(model.device)
    set_head(model.net, head)
    model.family = family_of(model.net)  # the family's sites and features now include the head
    model.labels = list(labels)
    model.zero_shot = ZeroShot(tuple(labels), tuple(templates), text.kind, text.scale, text.bias)


def set_head(net: nn.Module, head: ZeroShotHead) -> None:
    """The head goes where the family reads its classifier: OpenClipTower's `classifier`, a timm trunk's `head`."""
    if hasattr(net, "classifier"):
        net.classifier = head
    else:
        net.head = head
        net.num_classes = head.out_features


def texts_key(spec: WeightsSpec) -> str:
    """8 hex digits of the zero-shot labels and the templates: outputs of other labels go to another folder."""
    import hashlib
    import json

    texts = {"labels": list(spec_labels(spec) or ()), "templates": list(spec.templates)}
    return hashlib.sha256(json.dumps(texts, ensure_ascii=False).encode("utf-8")).hexdigest()[:8]


def single_label_warning(model: Any) -> str | None:
    """The warning a softmax over one label deserves: its probability is 1 whatever the image."""
    zero_shot = getattr(model, "zero_shot", None)
    if zero_shot is None or zero_shot.kind != "softmax" or len(zero_shot.labels) != 1:
        return None
    return (
        f"one zero-shot label ({zero_shot.labels[0]!r}): a softmax over one label gives probability 1 whatever the "
        "image; give more labels, or read the logit (scale * cosine)"
    )
