"""`vitcli trace` as a library: its Job (settings, checks, name, computation, presentation) and the builder
that the command, `vitcli run` configs and the Python API call."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from vitcli.errors import UsageError
from vitcli.jobs import ImageWork, Job, Presentation, builds_jobs
from vitcli.naming import result_name, setting
from vitcli.spec import check_count


class TraceJob(Job):
    command = "trace"

    def __init__(self, token: list[str] | None = None, blocks: list[str] | None = None, values: int = 3):
        self.token_texts = list(token or [])
        self.block_texts = list(blocks or ["1"])
        self.values = values
        self.followed: list[Any] = []  # FollowedToken, resolved against the grid by check()
        self.opened: list[int] = []
        self.depth = 0

    def check(self, architecture: Any) -> None:
        from vitcli.experiments.trace import READOUTS, parse_blocks, parse_tokens
        from vitcli.experiments.trace_bound import check_trace_bound, trace_size
        from vitcli.loading import require_vit

        if architecture.global_pool not in READOUTS:
            raise UsageError(
                f"{architecture.name} pools its final rows with {architecture.global_pool!r}; trace follows models "
                "that read out the CLS row or the mean of the patch rows"
            )
        self.followed = parse_tokens(architecture.grid, self.token_texts)
        self.opened = parse_blocks(architecture.depth, self.block_texts)
        self.depth = architecture.depth
        check_count("--values", self.values, 1, architecture.longest_vector, "the longest vector of the forward")
        skeleton = require_vit(architecture.name)
        size = trace_size(
            skeleton, architecture.grid, architecture.num_classes, len(self.followed), len(self.opened), self.values
        )
        check_trace_bound(size)

    def name(self) -> str:
        if self.opened == list(range(1, self.depth + 1)):
            blocks: Any = "all"
        else:
            blocks = self.opened or "none"
        tokens = [token.name for token in self.followed]
        return result_name("trace", setting("t", tokens), setting("b", blocks), setting("v", self.values))

    def settings(self) -> dict[str, Any]:
        return {
            "tokens": [{"name": token.name, "token": token.token} for token in self.followed],
            "blocks": self.opened,
            "values": self.values,
        }

    def compute(self, work: ImageWork) -> Any:
        from vitcli.experiments.trace import trace_image

        return trace_image(work.model, work.image, self.followed, self.opened, self.values)

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
