"""`vitcli explore` as a library: its Job (settings, plan, name, computation, presentation) and the builder
that the command, `vitcli run` configs and the Python API call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import typer

from vitcli.jobs import ImageWork, Job, Presentation, builds_jobs
from vitcli.naming import result_name, setting


@dataclass(frozen=True)
class ExplorePlan:
    """The blocks an explore page shows, resolved against the model's depth (ExploreJob.plan)."""

    blocks: tuple[int, ...]  # one-based
    depth: int  # the model's blocks: the name says `all` for every one of them


class ExploreJob(Job):
    """One explorer page per image: every query's attention in the chosen blocks, within the page's size bound."""

    command = "explore"
    needs_classes = False

    def __init__(self, blocks: str | None, explain: Job | None = None, planned: ExplorePlan | None = None):
        """`explain`: explain's own job with its defaults (every cheap method, the top-1 class), whose maps the page
        shows as `vitcli explain` draws them; planned with this job."""
        self.blocks_text = blocks
        self.explain = explain
        self.needs_classes = explain is not None  # type: ignore[misc]  (explain's maps follow a class)
        self._planned = planned

    def plan(self, architecture: Any) -> ExploreJob:
        from vitcli.experiments.explore import check_page_bound, parse_blocks

        blocks = parse_blocks(self.blocks_text, architecture.depth)
        check_page_bound(
            architecture.name,
            architecture.depth,
            architecture.num_heads,
            architecture.grid,
            blocks,
            self.blocks_text is not None,
        )
        explain = None if self.explain is None else self.explain.plan(architecture)
        return ExploreJob(self.blocks_text, explain, ExplorePlan(tuple(blocks), architecture.depth))

    def uses(self) -> tuple[str, ...]:
        return ("explore --explain",) if self.explain is not None else ("explore",)

    def name(self) -> str:
        chosen = list(self.planned.blocks)
        every = chosen == list(range(1, self.planned.depth + 1))  # `all`, `1-12` and no --blocks: one name
        blocks = setting("b", None if every else _blocks_part(chosen))
        return result_name("explore", blocks, "explain" if self.explain is not None else None)

    def settings(self) -> dict[str, Any]:
        explain = None if self.explain is None else self.explain.settings()
        return {"blocks": list(self.planned.blocks), "explain": explain}

    def compute(self, work: ImageWork) -> Any:
        from vitcli.experiments.attention import require_attention
        from vitcli.experiments.explore import explore

        require_attention(work.model)  # the explicit forward, or the family's captured attn.hook_pattern
        (result,) = explore(work.model, [work.image], list(self.planned.blocks))
        if self.explain is not None:
            result.explanation = self.explain.compute(work)
        return result

    def present(self, result: Any) -> Presentation:
        from vitcli.presentation import explore as view

        presentation = Presentation.of(view, result)
        page = view.page(result)
        presentation.document["page_bytes"] = len(page.encode("utf-8"))
        presentation.extra_files["html"] = page
        return presentation


def _blocks_part(blocks: list[int]) -> str:
    """Blocks in a file name: runs as first-last joined by `_` (1-4_12)."""
    runs: list[list[int]] = []
    for block in blocks:
        if runs and block == runs[-1][-1] + 1:
            runs[-1].append(block)
        else:
            runs.append([block])
    return "_".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


@builds_jobs("explore")
def explore_jobs(
    blocks: Annotated[
        str | None,
        typer.Option(
            help="Blocks on the page: 4, 1-4, 1,6,12 or all (default: all, when they fit the page's bound of "
            "2,000,000 attention values).",
            show_default=False,
        ),
    ] = None,
    explain: Annotated[
        bool,
        typer.Option(
            "--explain",
            help="Also compute `vitcli explain`'s default maps (top-1 class) and offer them in the main panel.",
        ),
    ] = False,
) -> list[Job]:
    from vitcli.jobs.explain import explain_jobs

    return [ExploreJob(blocks, explain_jobs()[0] if explain else None)]
