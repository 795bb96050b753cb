"""What a command asks of the model wrapper, in a module light enough for the CLI's start-up path."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"


@dataclass(frozen=True)
class WeightsSpec:
    """Which network to build and where its weights come from."""

    model_name: str = DEFAULT_MODEL
    random: bool = False
    seed: int = 0
    checkpoint: Path | None = None
    labels: Path | None = None  # class names, one per line (see vitcli.loading)

    @property
    def label(self) -> str:
        """How every table and CSV row names the weights."""
        if self.random:
            return f"RANDOM (seed {self.seed})"
        if self.checkpoint is not None:
            return f"checkpoint {self.checkpoint.name}"
        return "pretrained"
