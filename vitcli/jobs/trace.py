"""`vitcli trace` as a library: its Job (settings, plan, name, computation, presentation) and the builder
that the command, `vitcli run` configs and the Python API call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import typer

from vitcli.errors import UsageError
from vitcli.jobs import ImageWork, Job, Presentation, builds_jobs
from vitcli.naming import result_name, setting
from vitcli.spec import check_count


@dataclass(frozen=True)
class TracePlan:
    """A trace job's tokens and blocks resolved against the model's grid and depth (TraceJob.plan)."""

    followed: tuple[Any, ...]  # experiments.trace.FollowedToken
    opened: tuple[int, ...]  # one-based blocks opened up
    depth: int  # the model's blocks: the name says `all` for every one of them


class TraceJob(Job):
    command = "trace"

    def __init__(
        self,
        token: list[str] | None = None,
        blocks: list[str] | None = None,
        values: int = 3,
        planned: TracePlan | None = None,
    ):
        self.token_texts = list(token or [])
        self.block_texts = list(blocks or ["1"])
        self.values = values
        self._planned = planned

    def plan(self, architecture: Any) -> TraceJob:
        from vitcli.experiments.trace import READOUTS, parse_blocks, parse_tokens
        from vitcli.experiments.trace_bound import check_trace_bound, trace_size
        from vitcli.loading import require_vit

        if architecture.global_pool not in READOUTS:
            raise UsageError(
                f"{architecture.name} pools its final rows with {architecture.global_pool!r}; trace follows models "
                "that read out the CLS row or the mean of the patch rows"
            )
        followed = parse_tokens(architecture.grid, self.token_texts)
        opened = parse_blocks(architecture.depth, self.block_texts)
        check_count("--values", self.values, 1, architecture.longest_vector, "the longest vector of the forward")
        skeleton = require_vit(architecture.name)
        size = trace_size(
            skeleton, architecture.grid, architecture.num_classes, len(followed), len(opened), self.values
        )
        check_trace_bound(size)
        planned = TracePlan(tuple(followed), tuple(opened), architecture.depth)
        return TraceJob(self.token_texts, self.block_texts, self.values, planned)

    def name(self) -> str:
        planned = self.planned
        if list(planned.opened) == list(range(1, planned.depth + 1)):
            blocks: Any = "all"
        else:
            blocks = list(planned.opened) or "none"
        tokens = [token.name for token in planned.followed]
        return result_name("trace", setting("t", tokens), setting("b", blocks), setting("v", self.values))

    def settings(self) -> dict[str, Any]:
        return {
            "tokens": [{"name": token.name, "token": token.token} for token in self.planned.followed],
            "blocks": list(self.planned.opened),
            "values": self.values,
        }

    def compute(self, work: ImageWork) -> Any:
        from vitcli.experiments.trace import trace_image

        planned = self.planned
        return trace_image(work.model, work.image, list(planned.followed), list(planned.opened), self.values)

    def present(self, result: Any) -> Presentation:
        from vitcli.presentation import trace as view

        return Presentation.of(view, result)


@builds_jobs("trace")
def trace_jobs(
    token: Annotated[
        list[str] | None,
        typer.Option(
            "--token",
            "-t",
            help="Rows followed in full: 0 or cls, 63, P63, r4c6 (zero-based), comma-separated or repeated "
            "(default: CLS).",
            show_default=False,
        ),
    ] = None,
    blocks: Annotated[
        list[str] | None,
        typer.Option(
            "--blocks",
            "-b",
            help="Blocks opened in full (one-based): 1, 1,12, 3-5, all or none (default: 1); the others get one "
            "summary line each.",
            show_default=False,
        ),
    ] = None,
    values: Annotated[
        int, typer.Option("--values", min=1, help="Leading values shown per vector (JSON keeps full rows).")
    ] = 3,
) -> list[Job]:
    if values < 1:
        raise UsageError(f"--values must be at least 1, not {values}")
    return [TraceJob(token, blocks, values)]
