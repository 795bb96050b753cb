"""The capture layer: the only code that hooks a network. Sites by name on every family (see `sites`), the family
adapters that map each kind of network onto them (`families`), and the edits a replacing hook returns (`edits`)."""

from vitcli.capture.edits import Part, replaced
from vitcli.capture.families import family_of
from vitcli.capture.family import BlockPlace, Family, Tap
from vitcli.capture.pooled import pooled_output
from vitcli.capture.sites import (
    BLOCK_SITES,
    MODEL_SITES,
    SiteError,
    block_site,
    caching,
    head_site,
    hooks,
    pattern_site,
    resid_pre_site,
    sublayer_site,
)
from vitcli.capture.support import logits_from, pre_norm_refusal, require_pre_norm

__all__ = [
    "BLOCK_SITES",
    "MODEL_SITES",
    "BlockPlace",
    "Family",
    "Part",
    "SiteError",
    "Tap",
    "block_site",
    "caching",
    "family_of",
    "head_site",
    "hooks",
    "logits_from",
    "pre_norm_refusal",
    "require_pre_norm",
    "pattern_site",
    "pooled_output",
    "replaced",
    "resid_pre_site",
    "sublayer_site",
]
