"""The capture layer: the only code that hooks a network. Sites by name on every family (see `sites`), the family
adapters that map each kind of network onto them (`families`), and the edits a replacing hook returns (`edits`)."""

from vitcli.capture.checks import attention_output, attention_self_check
from vitcli.capture.edits import Part, replaced
from vitcli.capture.families import family_of
from vitcli.capture.family import BlockPlace, Family, Tap
from vitcli.capture.modules import module_inputs_and_outputs
from vitcli.capture.pooled import pooled_output
from vitcli.capture.sites import (
    BLOCK_SITES,
    MODEL_SITES,
    Kept,
    SiteError,
    block_site,
    caching,
    caching_with_gradients,
    head_site,
    hooks,
    pattern_site,
    resid_pre_site,
    sublayer_site,
    unfused_attention,
)
from vitcli.capture.support import logits_from, pre_norm_refusal

__all__ = [
    "BLOCK_SITES",
    "MODEL_SITES",
    "BlockPlace",
    "Family",
    "Kept",
    "Part",
    "SiteError",
    "Tap",
    "attention_output",
    "attention_self_check",
    "block_site",
    "caching",
    "caching_with_gradients",
    "family_of",
    "head_site",
    "hooks",
    "logits_from",
    "module_inputs_and_outputs",
    "pre_norm_refusal",
    "pattern_site",
    "pooled_output",
    "replaced",
    "resid_pre_site",
    "sublayer_site",
    "unfused_attention",
]
