"""`vitcli probe` as a library: its Job (settings, checks, name, presentation); the command computes the probe over
a data folder itself, so there is no builder yet."""

from __future__ import annotations

from typing import Any

from vitcli.errors import UsageError
from vitcli.jobs import Job, Presentation
from vitcli.naming import result_name, setting
from vitcli.spec import check_seed


class ProbeJob(Job):
    """One result about a data folder: computed by the command, not per image (so no `vitcli run` builder)."""

    command = "probe"
    needs_classes = False  # the probe brings its own head

    def __init__(self, val_fraction: float = 0.2, split_seed: int = 0, weight_decay: float = 1e-4):
        if not 0.0 <= val_fraction < 1.0:
            raise UsageError(f"--val-fraction must be at least 0 and below 1, not {val_fraction}")
        if weight_decay < 0:
            raise UsageError(f"--weight-decay must be at least 0, not {weight_decay}")
        check_seed("--split-seed", split_seed)
        self.val_fraction = val_fraction
        self.split_seed = split_seed
        self.weight_decay = weight_decay

    def name(self) -> str:
        return result_name(
            "probe",
            setting("vf", float(self.val_fraction)),
            setting("ss", self.split_seed),
            setting("wd", float(self.weight_decay)),
        )

    def settings(self) -> dict[str, Any]:
        return {"val_fraction": self.val_fraction, "split_seed": self.split_seed, "weight_decay": self.weight_decay}

    def present(self, result: Any) -> Presentation:
        from vitcli.presentation import probe as view

        return Presentation.of(view, result)
