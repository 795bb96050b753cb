"""What a command asks of the model wrapper, in a module light enough for the CLI's start-up path."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vitcli.errors import UsageError

DEFAULT_MODEL = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
# The seeds torch.manual_seed accepts (negative ones are folded into the unsigned 64-bit range).
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


@dataclass(frozen=True)
class WeightsSpec:
    """Which network to build, where its weights come from and where its class names come from.

    labels: a text file with one class name per line (UTF-8); None looks beside the checkpoint, then uses timm's
    ImageNet names when the head has their number of classes (see `vitcli.loading.class_names`).
    """

    model_name: str = DEFAULT_MODEL
    random: bool = False
    seed: int = 0
    checkpoint: Path | None = None
    labels: Path | None = None

    def __post_init__(self) -> None:
        # Checked here, before anything is built: torch would refuse it only after the skeleton and imports.
        if not SEED_MIN <= self.seed <= SEED_MAX:
            raise UsageError(f"--seed {self.seed} is outside the range torch accepts: {SEED_MIN} to {SEED_MAX}")

    @property
    def label(self) -> str:
        """How every table and CSV row names the weights."""
        if self.random:
            return f"RANDOM (seed {self.seed})"
        if self.checkpoint is not None:
            return f"checkpoint {self.checkpoint.name}"
        return "pretrained"
