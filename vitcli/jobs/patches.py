"""`vitcli patches` as a library: its Job (settings, plan, name, computation, presentation) and the builder
that the command, `vitcli run` configs and the Python API call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import typer

from vitcli.jobs import ImageWork, Job, Presentation, builds_jobs
from vitcli.naming import result_name, setting
from vitcli.spec import check_count


@dataclass(frozen=True)
class PatchesPlan:
    patches: tuple[int, ...]  # the patches asked for, as numbers on the model's grid


class PatchesJob(Job):
    command = "patches"
    needs_classes = False

    def __init__(self, patch: list[str] | None = None, values: int = 8, planned: PatchesPlan | None = None):
        self.patch_texts = list(patch or [])
        self.values = values
        self._planned = planned

    def plan(self, architecture: Any) -> PatchesJob:
        patches = tuple(architecture.grid.parse_patch(text) for text in self.patch_texts)
        longest = max(3 * architecture.grid.patch_size**2, architecture.embed_dim)
        check_count("--values", self.values, 1, longest, "a patch's pixels or its embedding, the longer")
        return PatchesJob(self.patch_texts, self.values, PatchesPlan(patches))

    def name(self) -> str:
        return result_name("patches", setting("p", list(self.planned.patches) or None), setting("v", self.values))

    def settings(self) -> dict[str, Any]:
        return {"patch": [f"P{patch}" for patch in self.planned.patches], "values": self.values}

    def compute(self, work: ImageWork) -> Any:
        from vitcli.experiments.patches import inspect_patches

        return inspect_patches(work.model, work.image, list(self.planned.patches))

    def present(self, result: Any) -> Presentation:
        from vitcli.presentation import patches as view

        return Presentation(
            view.table(result, self.values),
            view.rows(result, self.values),
            view.document(result),
            figure=lambda: view.figure(result),
            summary=view.summary(result),
        )


@builds_jobs("patches")
def patches_jobs(
    patch: Annotated[
        list[str] | None,
        typer.Option("--patch", "-p", help="Show this patch in full: 63, P63 or r4c6 (zero-based); repeatable."),
    ] = None,
    values: Annotated[
        int, typer.Option("--values", min=1, help="Leading values shown per vector and CSV projection columns.")
    ] = 8,
) -> list[Job]:
    return [PatchesJob(patch, values)]
