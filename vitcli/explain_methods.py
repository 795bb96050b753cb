"""The one registry of `vitcli explain`'s methods: what each needs of the model and of the image's passes, and which
options it reads. The command's choices, its checks, the experiment's passes and the support table all read it.

It imports nothing of vitcli, so every layer can read it (the support table in capture/ included).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExplainMethod:
    name: str
    # Reads every block's attention probabilities from the one hooked forward (attn.hook_pattern).
    attention: bool = False
    # Reads the gradients of the one hooked backward of the target's logit (at the attention or at a block's rows).
    hooked_backward: bool = False
    # Runs its own backward passes to the input pixels (model.batch_size copies per backward).
    pixel_gradients: bool = False
    # Explains logit(target) - logit(contrast) with --contrast (occlusion's drop is a probability, not a logit).
    contrastive: bool = False
    # Reads one block, --block: Grad-CAM at its rows, attention at its pattern.
    reads_block: bool = False
    # Covers the image (one forward per patch) and so reads --fill.
    covers: bool = False
    # Carries attention across blocks on one token grid (models of stages, Swin, cannot).
    across_blocks: bool = False
    # Multiplies attention across blocks by rollout, which reads the head fusion and the discard ratio.
    rolls_out: bool = False
    # A reference map that reads the image alone, never the model (vitcli.experiments.baselines): random, edge.
    baseline: bool = False
    # Cheap together in one hooked forward and backward: run when no --method is given.
    default: bool = False
    # The family features it needs beyond explain's own class head (capture.family.FEATURES); None: nothing more.
    # The support table (capture.support.COMMAND_NEEDS) has a row "explain --method NAME" for each that has some.
    needs: frozenset[str] | None = None


# What every method needs: a class head (or an embedding target in its place).
EXPLAIN_NEEDS = frozenset({"class_head"})
_PATTERN = frozenset({"class_head", "pattern"})

# In the order of the command's choices.
_REGISTRY = (
    ExplainMethod(
        "relevance",
        attention=True,
        hooked_backward=True,
        contrastive=True,
        across_blocks=True,
        default=True,
        needs=_PATTERN | {"plain_rows", "pattern_gradients"},
    ),
    ExplainMethod(
        "grad-rollout",
        attention=True,
        hooked_backward=True,
        contrastive=True,
        across_blocks=True,
        rolls_out=True,
        default=True,
        needs=_PATTERN | {"plain_rows", "pattern_gradients"},
    ),
    ExplainMethod("gradcam", hooked_backward=True, contrastive=True, reads_block=True, default=True),
    ExplainMethod("attention", attention=True, reads_block=True, default=True, needs=_PATTERN | {"cls_token"}),
    ExplainMethod(
        "rollout", attention=True, across_blocks=True, rolls_out=True, default=True, needs=_PATTERN | {"plain_rows"}
    ),
    ExplainMethod("occlusion", covers=True),
    ExplainMethod("ig", pixel_gradients=True, contrastive=True),
    ExplainMethod("smoothgrad", pixel_gradients=True, contrastive=True),
    ExplainMethod("gradient", pixel_gradients=True, contrastive=True),
    # The sum of attribute --by token's parts of every head's term per source token (the same features).
    ExplainMethod(
        "dla",
        contrastive=True,
        needs=frozenset({"class_head", "plain_rows", "replace", "heads", "pattern", "pooling_readout"}),
    ),
    # Baselines for benchmarks: a seeded uniform random map (--noise-seed), the input's Sobel edge magnitude.
    ExplainMethod("random", baseline=True),
    ExplainMethod("edge", baseline=True),
)

EXPLAIN_METHODS: dict[str, ExplainMethod] = {method.name: method for method in _REGISTRY}
METHOD_NAMES = tuple(EXPLAIN_METHODS)


def names_where(prop: str) -> tuple[str, ...]:
    """The methods with the property `prop` (a field of ExplainMethod), in the command's order."""
    return tuple(method.name for method in _REGISTRY if getattr(method, prop))


DEFAULT_METHODS = names_where("default")
ATTENTION_METHODS = frozenset(names_where("attention"))
HOOKED_BACKWARD_METHODS = frozenset(names_where("hooked_backward"))
PIXEL_METHODS = names_where("pixel_gradients")
CONTRAST_METHODS = names_where("contrastive")
READS_BLOCK_METHODS = frozenset(names_where("reads_block"))
ROLLOUT_METHODS = frozenset(names_where("rolls_out"))
COVERING_METHODS = frozenset(names_where("covers"))
BASELINE_METHODS = frozenset(names_where("baseline"))
# Rollout first, then the methods that build on it: the refusal on models of stages names the first one given.
ACROSS_BLOCKS_METHODS = names_where("across_blocks")[::-1]
