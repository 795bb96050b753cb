"""The text side of an image-text model (open_clip's CLIP and SigLIP): texts to unit vectors in the image
embedding's space, and how the model turns a cosine into a logit.

CLIP scores an image against texts by `scale * cos` and a softmax over the texts; SigLIP by `scale * cos + bias` and
an independent sigmoid per text (`kind`). Embeddings are computed once per text and tower (a run asks for the same
label and target texts many times), on the model's device, and handed back as CPU float32.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812  (the usual name)
from torch import Tensor, nn

from vitcli.errors import UsageError, VitcliError
from vitcli.spec import PLACEHOLDER

# Texts per forward of the text tower.
TEXT_BATCH = 64


class TextLimits:
    """What a tokenizer accepts: texts no longer than its context, start and end tokens included. Usable before the
    weights load (the tokenizer and its context come with the model's name)."""

    def __init__(self, tokenizer: Callable[[], Any], context_length: int, name: str):
        self._tokenizer_factory = tokenizer
        self._tokenizer: Any = None
        self.context_length = int(context_length)
        self.name = name  # the model, as refusals name it

    @property
    def tokenizer(self) -> Any:
        """open_clip's tokenizer of the model, built on first use (SigLIP's comes from the Hugging Face cache)."""
        if self._tokenizer is None:
            self._tokenizer = self._tokenizer_factory()
        return self._tokenizer

    def token_count(self, text: str) -> int:
        """How many tokens the tokenizer makes of `text`, start and end tokens included, without truncation."""
        room = 8 * self.context_length  # enough to see that a text is too long, however long it is
        tokens = self.tokenizer([text], context_length=room)[0]
        pad = getattr(getattr(self.tokenizer, "tokenizer", None), "pad_token_id", None) or 0
        used = (tokens != pad).nonzero()
        return int(used[-1]) + 1 if len(used) else 0

    def check(self, texts: Sequence[str], option: str) -> None:
        """Refuse (UsageError) an empty list, an empty text, or a text longer than the tokenizer's context."""
        if not texts:
            raise UsageError(f"{option} is empty: give at least one text")
        for text in texts:
            if not text.strip():
                raise UsageError(f"{option}: a text is empty; give words")
            count = self.token_count(text)
            if count > self.context_length:
                shown = text if len(text) <= 60 else text[:57] + "..."
                raise UsageError(
                    f"{option}: {shown!r} is {count} tokens long, but the text tower of {self.name} reads at most "
                    f"{self.context_length} (start and end tokens included); shorten it"
                )


class TextTower:
    """Texts to unit embeddings; `kind`, `scale` and `bias` say how the model makes a logit of a cosine."""

    def __init__(
        self,
        encode_tokens: Callable[[Tensor], Tensor],
        limits: TextLimits,
        scale: float,
        bias: float | None,
        device: torch.device,
    ):
        self._encode_tokens = encode_tokens
        self.limits = limits
        self.context_length = limits.context_length
        self.name = limits.name
        self.scale = float(scale)
        self.bias = None if bias is None else float(bias)
        self.kind = "softmax" if bias is None else "sigmoid"
        self.device = device
        self._cache: dict[str, Tensor] = {}

    @property
    def tokenizer(self) -> Any:
        return self.limits.tokenizer

    def check(self, texts: Sequence[str], option: str) -> None:
        """Refuse (UsageError) an empty list, an empty text, or a text longer than the tokenizer's context."""
        self.limits.check(texts, option)

    def encode(self, texts: Sequence[str]) -> Tensor:
        """(n, D) float32 unit vectors on the CPU, in the space of the image embedding (model.family.pooled)."""
        missing = list(dict.fromkeys(text for text in texts if text not in self._cache))
        for start in range(0, len(missing), TEXT_BATCH):
            chunk = missing[start : start + TEXT_BATCH]
            tokens = self.tokenizer(chunk).to(self.device)
            with torch.no_grad():
                embedded = F.normalize(self._encode_tokens(tokens).float(), dim=-1).cpu()
            self._cache.update(zip(chunk, embedded, strict=True))
        if not texts:
            return torch.empty(0, 0)
        return torch.stack([self._cache[text] for text in texts])

    def encode_labels(self, labels: Sequence[str], templates: Sequence[str] = (PLACEHOLDER,)) -> Tensor:
        """(labels, D) unit vectors by CLIP's ImageNet recipe: per label, the mean of its templates' unit
        embeddings, renormalized. A template holds `{}` where the label goes."""
        texts = [fill(template, label) for label in labels for template in templates]
        embedded = self.encode(texts).reshape(len(labels), len(templates), -1)
        return F.normalize(embedded.mean(dim=1), dim=-1)

    def describe(self) -> dict[str, Any]:
        """The JSON's facts: how a cosine becomes a logit and a probability."""
        return {"kind": self.kind, "scale": self.scale, "bias": self.bias, "context_length": self.context_length}


def fill(template: str, label: str) -> str:
    """The template's `{}` replaced by the label (str.replace, not str.format: other braces stay text)."""
    return template.replace(PLACEHOLDER, label)


def open_clip_text_limits(model_name: str) -> TextLimits:
    """The tokenizer and context of open_clip model `model_name`, from its config alone (before any weights load)."""
    import open_clip

    config = open_clip.get_model_config(model_name) or {}
    context = config.get("text_cfg", {}).get("context_length", 77)  # open_clip's default context
    return TextLimits(functools.partial(_open_clip_tokenizer, model_name), context, f"open_clip:{model_name}")


@functools.lru_cache(maxsize=4)
def _open_clip_tokenizer(model_name: str) -> Any:
    import open_clip

    try:
        return open_clip.get_tokenizer(model_name)
    except Exception as error:
        raise VitcliError(
            f"cannot build the tokenizer of open_clip:{model_name} ({first_line(error)}); open_clip fetches some "
            "tokenizers (SigLIP's) from the Hugging Face hub: connect once so they land in its cache"
        ) from error


def open_clip_text_tower(model: nn.Module, model_name: str, device: torch.device) -> TextTower:
    """The text tower of a loaded open_clip model (CLIP or CustomTextCLIP), with the model's own tokenizer."""
    model.eval().to(device)
    limits = open_clip_text_limits(model_name)
    limits.context_length = int(model.context_length)  # the built model's own, which its config sets
    bias = getattr(model, "logit_bias", None)
    return TextTower(
        encode_tokens=model.encode_text,
        limits=limits,
        scale=float(model.logit_scale.detach().exp().reshape(-1)[0]),
        bias=None if bias is None else float(bias.detach().reshape(-1)[0]),
        device=device,
    )


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "no reason given"
