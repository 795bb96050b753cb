"""Logit lens: read the class scores out of the rows after each block, with the model's own final norm and head.

After block b the CLS row goes through the model's final norm, fc_norm and head (the path `net.forward_head` takes
with token pooling), and the mean of the patch rows (prefix tokens excluded) through the same norm and head. The
capture layer only reads the block outputs (hook_resid_post) of the model's own forward, so the readout the model's
head itself reads (CLS with token pooling, the patch mean with average pooling, as BEiT and EVA-02) must equal the
model's logits exactly after the last block; the result carries that difference and a nonzero one is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from vitcli.capture import block_site, caching
from vitcli.errors import VitcliError
from vitcli.experiments.results import ClassProbability, class_probability
from vitcli.images import ImageSource
from vitcli.model import PreparedImage, VitModel
from vitcli.target_class import resolve_target

CLS = "CLS"
PATCH_MEAN = "patch mean"
READOUTS = (CLS, PATCH_MEAN)


@dataclass(frozen=True)
class LensReadout:
    block: int  # one-based: the rows leaving blocks[block - 1]
    readout: str  # CLS or PATCH_MEAN
    target_probability: float
    target_rank: int  # 1 = the largest logit; ties share the better rank
    top1: ClassProbability


@dataclass
class LensResult:
    source: ImageSource
    weights_label: str
    depth: int
    target: ClassProbability  # with the model's own (final) probability
    readouts: list[LensReadout]  # block by block, CLS before patch mean
    final_difference: float  # max |own readout after the last block - the model's logits|: 0 by construction
    own_readout: str = CLS  # the readout the model's head reads: CLS (token pooling) or PATCH_MEAN (average pooling)

    def series(self, readout: str) -> list[LensReadout]:
        return [row for row in self.readouts if row.readout == readout]


def logit_lens(model: VitModel, prepared: PreparedImage, target: str | None = None) -> LensResult:
    """The target's probability and rank and the top-1 class read after every block, from CLS and the patch mean."""
    net = model.net
    prefix = model.grid.num_prefix
    sites = [block_site(block, "hook_resid_post") for block in range(1, model.depth + 1)]
    with torch.inference_mode(), caching(net, sites) as captured:
        logits = net(prepared.input[None].to(model.device))
        outputs = [captured[site] for site in sites]
        # One block at a time, each as the model's own head runs it on one image (a matrix product over more rows
        # may round differently, and the model's own readout must match its logits exactly).
        cls_logits = torch.cat([net.head(net.head_drop(net.fc_norm(net.norm(rows)[:, 0]))) for rows in outputs])
        mean_logits = torch.cat(
            [net.head(net.head_drop(net.fc_norm(net.norm(rows[:, prefix:].mean(dim=1))))) for rows in outputs]
        )
    own_readout = PATCH_MEAN if model.family.pooling == "avg" else CLS
    own_logits = mean_logits if own_readout == PATCH_MEAN else cls_logits
    final_difference = float((own_logits[-1] - logits[0]).abs().max())
    if final_difference != 0.0:
        raise VitcliError(
            f"self-check failed: the logit lens ({own_readout} readout, as the model's head reads) after block "
            f"{model.depth} differs from the model's logits by "
            f"{final_difference:.3g}; it must equal them exactly"
        )
    probabilities = logits[0].float().cpu().softmax(dim=-1)
    index = resolve_target(model, target, probabilities)
    readouts = []
    for block in range(model.depth):
        for readout, scores in ((CLS, cls_logits[block]), (PATCH_MEAN, mean_logits[block])):
            readouts.append(_readout(model, block + 1, readout, scores.float().cpu(), index))
    return LensResult(
        prepared.source,
        model.spec.label,
        model.depth,
        class_probability(model.labels, index, probabilities),
        readouts,
        final_difference,
        own_readout,
    )


def _readout(model: VitModel, block: int, readout: str, logits: Tensor, target: int) -> LensReadout:
    probabilities = logits.softmax(dim=-1)
    top = int(logits.argmax())
    return LensReadout(
        block,
        readout,
        float(probabilities[target]),
        1 + int((logits > logits[target]).sum()),
        class_probability(model.labels, top, probabilities),
    )
