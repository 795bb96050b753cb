"""What an experiment follows when it is not a class: a number read off the pooled embedding, for any model, with or
without a classifier head.

    --target-image REF         cosine similarity of the pooled embeddings of the image and of REF
    --target-direction F.npy   the pooled embedding's dot product with a direction (a class mean, a probe's weight row)
    --target-feature N         coordinate N (from 0) of the pooled embedding
    --target-text T            scale x cosine similarity of the image's embedding and T's (a model with a text tower:
                               CLIP's logit for T); --contrast-text U subtracts the same for U

The pooled embedding is what a classifier head reads (timm's forward_head(..., pre_logits=True)); inside
`pooled_output` the model's own forward ends there, so every experiment's forward, batched or hooked, scores an
embedding target with `score`. A class target (`--target`, `--contrast`) keeps its logits and probabilities.

The options are parsed and checked here before any weights load (torch is imported only by what runs after).
"""

from __future__ import annotations

import hashlib
import math
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitcli.errors import UsageError, VitcliError
from vitcli.filenames import escaped_path
from vitcli.naming import setting

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    import numpy as np
    from torch import Tensor

    from vitcli.model import VitModel

CLASS, IMAGE, DIRECTION, FEATURE, TEXT = "class", "image", "direction", "feature", "text"
OPTIONS = {IMAGE: "--target-image", DIRECTION: "--target-direction", FEATURE: "--target-feature", TEXT: "--target-text"}
UNITS = {IMAGE: "cosine similarity", DIRECTION: "dot product", FEATURE: "feature value", TEXT: "scaled cosine"}


@dataclass(frozen=True)
class EmbeddingTarget:
    """One embedding target as parsed: its kind and value (the direction's values are read when parsed)."""

    kind: str  # IMAGE, DIRECTION, FEATURE or TEXT
    reference: Path | None = None
    direction_file: Path | None = None
    feature: int | None = None
    direction: np.ndarray | None = field(default=None, compare=False, repr=False)  # (D,) float64
    sha256: str | None = None  # of the reference image, the direction file, or the text(s) (text_sha256)
    text: str | None = None
    contrast_text: str | None = None
    scale: float | None = None  # the text tower's exp(logit_scale), known once the weights load (bind)
    templates: tuple[str, ...] = ()  # --template's, which the text is put in (bind: the loaded model's spec)

    @property
    def option(self) -> str:
        return OPTIONS[self.kind]

    @property
    def unit(self) -> str:
        return UNITS[self.kind]

    def check(self, architecture: Any) -> None:
        """Refuse a feature or a direction the model's pooled embedding cannot have, before any weights load."""
        if self.kind == TEXT:
            from vitcli.text_targets import check_text_target

            check_text_target(self, architecture)
            return
        width = architecture.embedding_width
        if self.kind == FEATURE and not 0 <= self.feature < width:
            raise UsageError(
                f"--target-feature {self.feature} does not exist: the pooled embedding of {architecture.name} has "
                f"features 0..{width - 1}"
            )
        if self.kind == DIRECTION and self.direction.shape != (width,):
            raise UsageError(
                f"--target-direction {escaped_path(self.direction_file)} holds an array of shape "
                f"{tuple(self.direction.shape)}: {architecture.name}'s pooled embedding needs a 1-D array of {width} "
                "values"
            )

    @property
    def name_part(self) -> str:
        """The result name's part: distinct targets give distinct names."""
        if self.kind == FEATURE:
            return f"tf{self.feature}"
        return setting({IMAGE: "timg", DIRECTION: "tdir", TEXT: "ttxt"}[self.kind], self.sha256[:10])

    def describe(self) -> dict[str, Any]:
        """The target as JSON: its kind and value."""
        if self.kind == IMAGE:
            value = {"reference": escaped_path(self.reference), "sha256": self.sha256}
        elif self.kind == DIRECTION:
            value = {
                "file": escaped_path(self.direction_file),
                "sha256": self.sha256,
                "norm": float(math.sqrt(float((self.direction**2).sum()))),
            }
        elif self.kind == TEXT:
            value = {
                "text": self.text,
                "contrast_text": self.contrast_text,
                "templates": list(self.templates),
                "sha256": self.sha256,
                "scale": self.scale,
            }
        else:
            value = {"index": self.feature}
        return {"kind": self.kind, **value, "score": self.definition}

    @property
    def definition(self) -> str:
        if self.kind == IMAGE:
            return "cosine similarity of the pooled embeddings of the image and of the reference image"
        if self.kind == DIRECTION:
            return "dot product of the pooled embedding with the direction"
        if self.kind == TEXT:
            contrast = "" if self.contrast_text is None else ", minus the same for contrast_text"
            return (
                "scaled cosine: scale x cosine similarity of the image embedding and the embedding of text"
                f"{contrast} (scale = exp(logit_scale), as in the model's zero-shot logits; with templates, a text's "
                "embedding is the mean of its templates' unit embeddings, renormalized)"
            )
        return f"coordinate {self.feature} (from 0) of the pooled embedding"

    @property
    def short(self) -> str:
        """A few words for titles and tables."""
        if self.kind == IMAGE:
            return f"cosine to {self.reference.name}"
        if self.kind == DIRECTION:
            return f"direction {self.direction_file.name}"
        if self.kind == TEXT:
            return f"text {self.text!r}" + ("" if self.contrast_text is None else f" - {self.contrast_text!r}")
        return f"feature {self.feature}"


def parse_embedding_target(
    target: str | None,
    image: str | Path | None,
    direction: str | Path | None,
    feature: int | None,
    contrast: str | None = None,
    text: str | None = None,
    contrast_text: str | None = None,
) -> EmbeddingTarget | None:
    """The embedding target of a command's options (None when none is given), refused with UsageError when the
    options contradict each other or a file cannot be used; nothing here needs the model."""
    given = [
        option
        for option, value in zip(OPTIONS.values(), (image, direction, feature, text), strict=True)
        if value is not None
    ]
    if contrast_text is not None and text is None:
        raise UsageError("--contrast-text applies to --target-text only: give --target-text as well")
    if not given:
        return None
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)} both name the target: give one of them")
    if target is not None:
        raise UsageError(f"{given[0]} and --target both name the target: give one of them")
    if contrast is not None:
        hint = ": use --contrast-text for a second text" if text is not None else ""
        raise UsageError(f"--contrast takes a second class and applies to --target only, not to {given[0]}{hint}")
    if text is not None:
        from vitcli.text_targets import parse_text_target

        return EmbeddingTarget(TEXT, **parse_text_target(text, contrast_text))
    if feature is not None:
        if feature < 0:
            raise UsageError(
                f"--target-feature must be 0 or more (a coordinate of the pooled embedding), not {feature}"
            )
        return EmbeddingTarget(FEATURE, feature=feature)
    if image is not None:
        from vitcli.images import load_rgb

        path = Path(image)
        try:
            _, source = load_rgb(path)
        except VitcliError as error:
            raise UsageError(f"--target-image: {error}") from error
        return EmbeddingTarget(IMAGE, reference=path, sha256=source.sha256)
    return EmbeddingTarget(DIRECTION, direction_file=Path(direction), **_read_direction(Path(direction)))


def _read_direction(path: Path) -> dict[str, Any]:
    import numpy as np

    shown = escaped_path(path)
    if path.suffix.lower() != ".npy":
        raise UsageError(f"--target-direction {shown} is not a .npy file (numpy.save writes one)")
    try:
        data = path.read_bytes()
    except OSError as error:
        raise UsageError(f"--target-direction {shown}: {(error.strerror or str(error)).lower()}") from error
    import io

    try:
        values = np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as error:  # numpy reports a bad header or a pickled array with several exception types
        raise UsageError(f"--target-direction {shown} is not a .npy array numpy can read without pickle") from error
    if not isinstance(values, np.ndarray) or values.dtype.kind not in "fiu":
        raise UsageError(f"--target-direction {shown} does not hold an array of numbers")
    if values.ndim != 1:
        raise UsageError(
            f"--target-direction {shown} holds an array of shape {tuple(values.shape)}: give a 1-D array "
            "(one value per feature of the pooled embedding)"
        )
    direction = values.astype(np.float64)
    if not np.isfinite(direction).all():
        raise UsageError(f"--target-direction {shown} holds NaN or infinite values")
    return {"direction": direction, "sha256": hashlib.sha256(data).hexdigest()}


# ----- scoring (torch from here on)


class BoundTarget:
    """An embedding target on a loaded model: `score` reads it off pooled embeddings (B, D) -> (B,), differentiably."""

    def __init__(self, target: EmbeddingTarget, vector: Tensor | None):
        self.target = target
        self.kind = target.kind
        # (D,) float32: REF's pooled embedding, the direction, or scale x (T's unit text embedding - U's); None for a
        # feature
        self.vector = vector

    def score(self, pooled: Tensor) -> Tensor:
        import torch.nn.functional as F  # noqa: N812  (the usual name)

        if self.kind == FEATURE:
            return pooled[:, self.target.feature]
        vector = self.vector.to(pooled.device, pooled.dtype)
        if self.kind == IMAGE:
            return F.cosine_similarity(pooled, vector[None], dim=-1)
        if self.kind == TEXT:  # scale x (cos(image, T) - cos(image, U)): the unit image embedding . the vector
            return F.normalize(pooled, dim=-1) @ vector
        return pooled @ vector

    def readout(self, pooled: Tensor) -> Tensor:
        """The vector w (D,) float64 with score = pooled . w for this one pooled embedding (D,): the direction, the
        unit vector of the feature, or for the image target REF's unit embedding divided by |pooled| (the norm of
        the image's own embedding frozen at this image's value, as a LayerNorm's scale is)."""
        import torch

        pooled = pooled.double().cpu()
        if self.kind == FEATURE:
            unit = torch.zeros_like(pooled)
            unit[self.target.feature] = 1.0
            return unit
        vector = self.vector.double().cpu()
        if self.kind == IMAGE:
            return vector / vector.norm() / pooled.norm()
        if self.kind == TEXT:
            return vector / pooled.norm()
        return vector

    def describe(self, clean_score: float) -> dict[str, Any]:
        return {**self.target.describe(), "clean_score": clean_score}


def bind(target: EmbeddingTarget, model: VitModel) -> BoundTarget:
    """The target on a loaded model: REF's pooled embedding is computed once, by the model's own forward."""
    import torch

    if target.kind == IMAGE:
        reference = model.prepare(target.reference).input[None].to(model.device)
        with torch.inference_mode():
            vector = model.family.pooled(reference)[0].float().cpu()
        return BoundTarget(target, vector)
    if target.kind == DIRECTION:
        return BoundTarget(target, torch.from_numpy(target.direction).float())
    if target.kind == TEXT:
        from vitcli.text_targets import bind_text

        return BoundTarget(*bind_text(target, model))
    return BoundTarget(target, None)


def bind_targets(jobs: Any, model: VitModel) -> None:
    """Each job's embedding target bound once, right after the weights load and before any image: a text that its
    templates make too long for the tokenizer is then refused in one line with exit 2, not once per image."""
    for job in jobs:
        if getattr(job, "embedding_target", None) is not None:
            job.bound_target(model)


def output_of(model: VitModel, target: Any) -> AbstractContextManager[None]:
    """The forward's output `target` reads: the pooled embedding for an embedding target, else the logits."""
    from vitcli.capture import pooled_output

    return pooled_output(model.family) if isinstance(target, BoundTarget) else nullcontext()


def score_of(output: Tensor, target: int | BoundTarget, contrast: int | None = None) -> Tensor:
    """(B,) scores of a forward's (B, ...) output: an embedding target's score of pooled embeddings, or a class's
    logit (minus the contrast class's) of logits; differentiable."""
    if isinstance(target, BoundTarget):
        return target.score(output)
    return output[:, target] - output[:, contrast] if contrast is not None else output[:, target]
