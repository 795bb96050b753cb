"""What every command needs of a model, and the one check that refuses a model lacking it before any weights load.

`COMMAND_NEEDS` names, for each command (or a command with the option that changes what it reads), the family
FEATURES it needs (capture.family.FEATURES). `require_support` is the one place every command's usage check goes
through: one line, exit 2, naming the model, its family and what it lacks. docs/models.md's family x command table
is generated from this table and the family adapters (`python -m vitcli.capture.family_table docs/models.md`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor, nn

from vitcli.capture.families import family_of
from vitcli.capture.family import FEATURES, Family
from vitcli.errors import UsageError
from vitcli.explain_methods import EXPLAIN_METHODS, EXPLAIN_NEEDS

# attribute --by token's parts of every head's term per source token: what explain's dla map sums.
_TOKEN_PARTS = EXPLAIN_METHODS["dla"].needs

# Each command, or a command with the option that makes it read more of the model, -> the features it needs.
COMMAND_NEEDS: dict[str, frozenset[str]] = {
    key: frozenset(needs)
    for key, needs in {
        "predict": {"class_head"},
        "patches": {"linear_patches", "plain_rows"},
        "attend": {"pattern"},
        "attend --view summary": {"pattern", "plain_rows"},
        "attend --view all-blocks": {"pattern", "plain_rows"},
        "attend --view rollout": {"pattern", "plain_rows"},
        "attend --pool": {"attention_pooling"},
        "occlude-quadrants": {"class_head"},
        "occlude-patches": {"class_head"},
        "trace": {"class_head", "linear_head", "explicit_forward", "linear_patches", "plain_rows", "plain_pooling"},
        "compare": {"class_head", "linear_head", "cls_token", "plain_rows"},
        "explain": EXPLAIN_NEEDS,  # the pixel-gradient methods, Grad-CAM and occlusion
        "bench": EXPLAIN_NEEDS,  # explain's maps of the scene's class; a method that needs more gets a row saying why
        # The methods that need more (vitcli.explain_methods), in the table's order of rows.
        **{
            f"explain --method {name}": EXPLAIN_METHODS[name].needs
            for name in ("attention", "rollout", "relevance", "grad-rollout", "dla")
        },
        # lens: the CLS and patch-mean readouts
        "lens": {"class_head", "linear_head", "plain_rows", "cls_token", "plain_pooling"},
        # By block: on Swin, the last stage's blocks and the rows entering it (experiments.attribution).
        "attribute": {"class_head", "replace", "pooling_readout"},
        "attribute --by head": {"class_head", "plain_rows", "replace", "heads", "pooling_readout"},
        "attribute --by token": _TOKEN_PARTS,
        "ablate": {"class_head", "replace", "heads"},
        "patch": {"class_head", "replace", "plain_rows"},
        # Its closed form counts attention over one token grid in every block (not windows on merged grids).
        "compare-patch-size": {"linear_patches", "plain_rows", "plain_pooling", "timm_blocks"},
        "compare-patch-size --adapt": {
            "class_head",
            "linear_head",
            "linear_patches",
            "plain_rows",
            "plain_pooling",
            "timm_blocks",
        },
        "probe": set(),  # the pooled embedding, which every family gives
        "explore": {"pattern", "plain_rows"},
        "explore --explain": {"class_head", "pattern", "plain_rows"},
        "anatomy --view filters": {"linear_patches"},
        "anatomy --view positions": {"positions", "plain_rows"},
        "anatomy --view distance": {"pattern", "plain_rows"},
        "anatomy --view cka": {"plain_rows"},
        "anatomy --view pca": {"plain_rows"},
        "anatomy --view norms": {"plain_rows"},
        # Each head's direct contribution to the image embedding, described by the texts' embeddings.
        "heads": {"text_tower", "heads", "plain_rows"},
    }.items()
}

# Commands whose class can be an embedding target instead (--target-image, --target-direction, --target-feature).
TARGET_COMMANDS = frozenset(("explain", "occlude-quadrants", "occlude-patches", "attribute", "ablate", "patch"))
TARGET_OPTIONS = (
    "--target-image REF, --target-direction FILE.npy, --target-feature N or, on a model with a text tower, "
    "--target-text TEXT"
)

# Which models have a text tower, as refusals of text options name them.
TEXT_TOWER_FAMILIES = "open_clip models (--model open_clip:NAME: CLIP's and SigLIP's image towers)"

# What a model lacking a feature has not, as a refusal says it.
LACKS = {
    "pattern": "no attention probabilities vitcli can capture in every block",
    "heads": "no per-head outputs entering a linear output projection",
    "replace": "no sites vitcli can replace",
    "plain_rows": "no single token grid through every block (windows or patch merging)",
    "explicit_forward": "no forward vitcli can write out by hand",
    "linear_patches": "no patch embedding that is one linear map of the pixels",
    "class_head": "no classifier head (num_classes=0)",
    "linear_head": "no classifier head that is one Linear layer (a zero-shot head normalizes the image embedding "
    "before its label texts read it)",
    "cls_token": "no class token",
    "positions": "no learned absolute position embeddings",
    "plain_pooling": "no head reading the CLS row or the mean of the final rows (it pools by attention)",
    "pooling_readout": "no pooling attribution can write as a linear map (the CLS row, the mean, or timm's attention "
    "pooling)",
    "attention_pooling": "no attention pooling (its pooled embedding is the CLS row or the mean of the final rows)",
    "pattern_gradients": "no attention probabilities in the forward's graph (vitcli computes them beside the module, "
    "so no gradient reaches them)",
    "timm_blocks": "no timm standard blocks (Block, Attention, Mlp), whose cost vitcli counts and rebuilds at other "
    "patch sizes",
    "text_tower": f"no text tower ({TEXT_TOWER_FAMILIES} have one)",
}


# The features a block that is not the family's standard one takes away; its refusal says why.
STRUCTURAL = frozenset(("pattern", "heads", "replace", "explicit_forward"))


class Supported(Protocol):
    """What the check reads of a model: an Architecture (loading.describe) or the facts of a net (facts_of)."""

    name: str
    family: str
    features: frozenset[str]
    family_refusal: str | None  # why its blocks cannot be taken apart at their sites, if they cannot


def family_features(family: Family) -> frozenset[str]:
    """What `family` offers: its adapter's features and those its grid and pooling tell (a class token at row 0, a
    head reading the CLS row or the mean), so that no adapter has to repeat them."""
    told = set()
    if family.grid().prefix_names[:1] == ("CLS",):
        told.add("cls_token")
    if family.pooling in ("token", "avg"):
        told.add("plain_pooling")
    if family.pooling in ("token", "avg", "map"):
        told.add("pooling_readout")
    if "pool.hook_pattern" in family.model_sites:
        told.add("attention_pooling")
    if "pattern" in family.features and family.pattern_in_forward:
        told.add("pattern_gradients")
    if "class_head" in family.features and not getattr(getattr(family.net, "head", None), "reads_texts", False):
        told.add("linear_head")  # a zero-shot head (vitcli.zero_shot) is not one Linear layer
    if getattr(family.net, "pairs_with_text", False):  # set by the loader of open_clip models (loading_towers)
        told.add("text_tower")
    return family.features | told


def missing_features(command: str, features: Collection[str], has_embedding_target: bool = False) -> list[str]:
    """The features `command` needs that `features` lacks, in FEATURES' order; an embedding target stands in for a
    class head where the command takes one."""
    needs = set(COMMAND_NEEDS[command])
    if has_embedding_target and command.split(" ", 1)[0] in TARGET_COMMANDS:
        needs -= {"class_head", "linear_head"}
    return [feature for feature in FEATURES if feature in needs and feature not in features]


def support_refusal(command: str, model: Supported, has_embedding_target: bool = False) -> str | None:
    """Why `model` cannot run `command` (one line naming the model, its family and what it lacks), or None."""
    missing = missing_features(command, model.features, has_embedding_target)
    if not missing:
        return None
    grids = list(dict.fromkeys(f"{place.grid.rows}x{place.grid.cols}" for place in getattr(model, "places", ())))
    stages = f"; its stages have the grids {', '.join(grids)}" if len(grids) > 1 else ""  # Swin: which grids
    lacks = "; ".join(LACKS[feature] + (stages if feature == "plain_rows" else "") for feature in missing)
    if model.family_refusal is not None and STRUCTURAL & set(missing):
        lacks += f" ({model.family_refusal})"
    message = f"`{command}` needs what {model.name} ({model.family}) lacks: {lacks}"
    if {"class_head", "linear_head"} & set(missing) and command.split(" ", 1)[0] in TARGET_COMMANDS:
        message += f"; give an embedding target ({TARGET_OPTIONS})"
    runs = supported_commands(model.features)
    if "class_head" in missing and runs:  # the usual case: a headless backbone, which still runs some commands
        message += f"; it runs {', '.join(runs)}"
    return message


def require_support(command: str, model: Supported | nn.Module, has_embedding_target: bool = False) -> None:
    """Refuse with UsageError when `model` (an Architecture, or a net or meta skeleton) lacks what `command` needs.

    Every command's usage check calls this before any weights load; `has_embedding_target` is True when the command
    was given --target-image, --target-direction or --target-feature."""
    if isinstance(model, nn.Module):
        model = facts_of(model)
    refusal = support_refusal(command, model, has_embedding_target)
    if refusal is not None:
        raise UsageError(refusal)


@dataclass(frozen=True)
class _Facts:
    name: str
    family: str
    features: frozenset[str]
    family_refusal: str | None


def facts_of(net: nn.Module, name: str | None = None) -> Supported:
    """The name, family, features and the family's refusal of a net or meta skeleton."""
    family = family_of(net)
    return _Facts(name or type(net).__name__, family.name, family_features(family), family.refusal())


def supported_commands(features: Collection[str]) -> list[str]:
    """The commands (without options) that run on a model with `features` in at least their plain form."""
    return list(dict.fromkeys(key.split(" ", 1)[0] for key, needs in COMMAND_NEEDS.items() if needs <= set(features)))


# ----- kept for the commands that take a model apart at its sites


def pre_norm_refusal(net: nn.Module, name: str) -> str | None:
    """Why `net` cannot be taken apart at its sites (naming what it lacks), or None when it can.

    Works on a meta-device skeleton, so commands refuse a model before its weights load."""
    reason = family_of(net).refusal()
    return None if reason is None else f"{name} is not a pre-norm ViT vitcli can take apart: {reason}"


def logits_from(net: nn.Module, block: int, rows: Tensor) -> Tensor:
    """The model's own forward on from `rows` entering block `block` (one-based: the value of hook_resid_pre)."""
    return family_of(net).run_from(block, rows)
