"""`vitcli ablate` as a library: its Job (settings, plan, name, computation, presentation) and the builder
that the command, `vitcli run` configs and the Python API call."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from vitcli.errors import UsageError, VitcliError
from vitcli.jobs import ImageWork, Job, Presentation, builds_jobs
from vitcli.jobs.following import FollowsEmbedding, TargetOption, follows_embedding_target
from vitcli.naming import result_name, setting
from vitcli.spec import ascii_number
from vitcli.target_class import resolve_target_text
from vitcli.targets import EmbeddingTarget

SUBLAYERS = ("attn", "mlp")


class Mode(StrEnum):
    zero = "zero"
    mean = "mean"
    resample = "resample"


def parse_heads(text: str, heads: Sequence[int]) -> list[Any]:
    """`all` or `B.H,B.H,...` (blocks and heads from one) as head ablations, checked against the model's heads per
    block (`heads[B - 1]`: Swin's stages differ), in the order given, each once."""
    from vitcli.experiments.ablation import HEAD, Ablation

    depth = len(heads)
    if text.strip() == "all":
        return [Ablation(block, HEAD, head) for block in range(1, depth + 1) for head in range(1, heads[block - 1] + 1)]
    ablations = []
    for item in _items(text, "--heads"):
        block_text, _, head_text = item.partition(".")
        block, head = ascii_number(block_text), ascii_number(head_text)
        if block is None or head is None:
            raise UsageError(f"--heads {item!r}: write heads as BLOCK.HEAD (4.2), comma-separated, or all")
        if not 1 <= block <= depth:
            raise UsageError(f"--heads {item}: block {block} does not exist; blocks are 1..{depth}")
        if not 1 <= head <= heads[block - 1]:
            where = "each block has" if len(set(heads)) == 1 else f"block {block} has"
            raise UsageError(f"--heads {item}: head {head} does not exist; {where} heads 1..{heads[block - 1]}")
        ablations.append(Ablation(block, HEAD, head))
    return list(dict.fromkeys(ablations))


def parse_blocks(text: str, depth: int) -> list[Any]:
    """`all` or `B.attn,B.mlp,...`: whole attention or MLP sublayers, in the order given, each once."""
    from vitcli.experiments.ablation import Ablation

    if text.strip() == "all":
        return [Ablation(block, sublayer) for block in range(1, depth + 1) for sublayer in SUBLAYERS]
    ablations = []
    for item in _items(text, "--blocks"):
        block_text, _, sublayer = item.partition(".")
        block = ascii_number(block_text)
        if block is None or sublayer not in SUBLAYERS:
            raise UsageError(f"--blocks {item!r}: write sublayers as BLOCK.attn or BLOCK.mlp (4.attn), or all")
        if not 1 <= block <= depth:
            raise UsageError(f"--blocks {item}: block {block} does not exist; blocks are 1..{depth}")
        ablations.append(Ablation(block, sublayer))
    return list(dict.fromkeys(ablations))


def _items(text: str, option: str) -> list[str]:
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise UsageError(f"{option} {text!r}: an empty item; separate items with single commas")
    return items


SKIPPED_NAMED = 10  # a warning about unreadable reference images names this many of them


@dataclass(frozen=True)
class AblatePlan:
    """An ablate job's settings resolved against a model's blocks and heads (AblateJob.plan)."""

    target: int | None  # the class followed; None: each image's clean top-1
    ablations: tuple[Any, ...]  # experiments.ablation.Ablation: --heads' then --blocks', in the order given
    named_heads: str | None  # the parsed --heads and --blocks as the name writes them
    named_blocks: str | None


class AblateJob(FollowsEmbedding, Job):
    command = "ablate"

    def __init__(
        self,
        target: str | None,
        heads: str | None,
        blocks: str | None,
        mode: str,
        reference: list[Path],
        embedding: EmbeddingTarget | None = None,
        planned: AblatePlan | None = None,
    ):
        self.embedding_target = embedding
        self.target_text = target
        self.heads = heads
        self.blocks = blocks
        self.mode = mode
        self.reference = reference  # sorted image paths; empty for --mode zero
        self._planned = planned
        self._replacements: dict[Path | None, Any] = {}  # by the resampled image (None: one for every image)

    def plan(self, architecture: Any) -> AblateJob:
        from vitcli.loading import require_pre_norm

        require_pre_norm(architecture.name)
        ablations: list[Any] = []
        named_heads = named_blocks = None
        if self.heads is not None:
            per_block = [place.heads for place in architecture.places] or [architecture.num_heads] * architecture.depth
            heads = parse_heads(self.heads, per_block)
            named_heads = _named("h", heads, parse_heads("all", per_block))
            ablations += heads
        if self.blocks is not None:
            blocks = parse_blocks(self.blocks, architecture.depth)
            named_blocks = _named("s", blocks, parse_blocks("all", architecture.depth))
            ablations += blocks
        if self.embedding_target is not None:
            self.embedding_target.check(architecture)
        target = resolve_target_text(architecture, self.target_text)
        planned = AblatePlan(target, tuple(ablations), named_heads, named_blocks)
        return AblateJob(
            self.target_text, self.heads, self.blocks, self.mode, self.reference, self.embedding_target, planned
        )

    def name(self) -> str:
        return result_name(
            "ablate",
            self.planned.named_heads,
            self.planned.named_blocks,
            setting("m", self.mode),
            setting("r", _paths_hash(self.reference) if self.reference else None),
            self.target_name_part(),
        )

    def settings(self) -> dict[str, Any]:
        return {
            "target": self.planned.target,
            "heads": self.heads,
            "blocks": self.blocks,
            "mode": self.mode,
            # A folder of thousands stays one line: the count, the name's hash of the paths and the first path.
            "reference": {
                "images": len(self.reference),
                "paths_hash": _paths_hash(self.reference) if self.reference else None,
                "first": str(self.reference[0]) if self.reference else None,
            },
            "ablations": len(self.planned.ablations),
            **self.embedding_settings(),
        }

    def compute(self, work: ImageWork) -> Any:
        from vitcli.experiments.ablation import RESAMPLE, ablate, reference_replacements, resample_source

        ablations = list(self.planned.ablations)
        key = resample_source(self.reference, work.image.source.path) if self.mode == RESAMPLE else None
        if key not in self._replacements:
            paths = [key] if key is not None else self.reference
            self._replacements[key] = reference_replacements(work.model, self.mode, ablations, paths)
        work.steps.start(len(ablations), f"ablating {work.image.source.display_name}")
        return ablate(
            work.model,
            work.image,
            ablations,
            self._replacements[key],
            self.planned.target,
            on_progress=work.steps.advance,
            embedding=self.bound_target(work.model),
        )

    def present(self, result: Any) -> Presentation:
        from vitcli.presentation import ablation as view

        return Presentation.of(view, result)

    @classmethod
    def present_across_images(cls, documents: list[dict[str, Any]]) -> Presentation | None:
        """Per ablation: the mean change of each image's target and the fraction of images whose top-1 changed."""
        from vitcli.experiments.ablation import ablation_spread
        from vitcli.presentation import ablation as view

        spread = ablation_spread(documents)
        return Presentation(
            view.spread_table(spread),
            view.spread_rows(spread),
            view.spread_document(spread),
            figure=lambda: view.spread_figure(spread),
        )


def _named(prefix: str, ablations: list[Any], every: list[Any]) -> str:
    """Parsed --heads or --blocks in a file name: `all` for every one in the model's order, else the labels in the
    order given (the order of the result's rows); a long list by its count and a hash of its labels."""
    if ablations == every:
        return setting(prefix, "all") or ""
    compact = "_".join(ablation.label for ablation in ablations)
    if len(compact) <= 24:
        return setting(prefix, compact) or ""
    return setting(prefix, f"{len(ablations)}x{hashlib.sha256(compact.encode()).hexdigest()[:8]}") or ""


def _paths_hash(paths: list[Path]) -> str:
    joined = "\n".join(str(path.resolve()) for path in paths)
    return hashlib.sha256(joined.encode("utf-8", "surrogateescape")).hexdigest()[:8]


def _reference_images(argument: str, option: str) -> list[Path]:
    from vitcli.images import resolve_images

    try:
        return resolve_images([argument])
    except VitcliError as error:
        raise UsageError(f"{option} {argument}: {error}") from error


def _run_images(arguments: list[str] | None) -> list[Path]:
    """The images a command was given (all of them, before --shard), or the sample photo; unreadable ones are the
    run's failures, not the reference's."""
    from vitcli.images import resolve_images, sample_photo

    if not arguments:
        return [sample_photo()]
    paths: list[Path] = []
    for argument in arguments:
        try:
            paths.extend(resolve_images([argument]))
        except VitcliError:
            continue
    return list(dict.fromkeys(paths))


@builds_jobs("ablate")
@follows_embedding_target
def ablate_jobs(
    target: TargetOption = None,
    heads: Annotated[
        str | None,
        typer.Option(
            help="Heads to ablate one at a time: all, or BLOCK.HEAD items from one (4.2,11.3). Default: all, "
            "unless only --blocks is given.",
            show_default=False,
        ),
    ] = None,
    blocks: Annotated[
        str | None,
        typer.Option(
            help="Whole sublayers to ablate one at a time: all, or BLOCK.attn / BLOCK.mlp items (4.attn,4.mlp).",
            show_default=False,
        ),
    ] = None,
    mode: Annotated[
        Mode,
        typer.Option(
            help="zero: the output becomes 0; mean: its mean over the reference images, token by token; resample: "
            "its value on one reference image (the first, by path, that is not the image itself)."
        ),
    ] = Mode.zero,
    reference: Annotated[
        Path | None,
        typer.Option(
            help="Images (a folder, file or glob) for --mode mean and resample. Default: this run's images.",
            show_default=False,
        ),
    ] = None,
    run_images: list[str] | None = None,
    *,
    embedding: EmbeddingTarget | None = None,
) -> list[Job]:
    """run_images: the command line's images, the default reference of --mode mean and resample (a `vitcli run`
    config does not pass them: there the reference must be given)."""
    mode = str(mode)
    if mode not in {member.value for member in Mode}:
        raise UsageError(f"unknown --mode {mode!r}: choose one of {', '.join(member.value for member in Mode)}")
    if heads is None and blocks is None:
        heads = "all"
    if mode == Mode.zero:
        if reference is not None:
            raise UsageError("--reference sets what --mode mean and resample use; --mode zero replaces with 0")
        paths: list[Path] = []
    elif reference is not None:
        paths = _readable(_reference_images(str(reference), "--reference"), f"--reference {reference}", "its")
    elif run_images is not None:
        given = sorted(_run_images(run_images), key=lambda path: str(path.resolve()))
        paths = _readable(given, f"--mode {mode} (the reference is the images given)", "the") if given else []
    else:
        raise UsageError(f"--mode {mode} in a config needs --reference FOLDER (the images its replacements come from)")
    if not paths and mode != Mode.zero:
        raise UsageError(f"--mode {mode}: no reference images")
    return [AblateJob(target, heads, blocks, mode, paths, embedding)]


def _readable(paths: list[Path], described: str, whose: str) -> list[Path]:
    """The reference images that can be read, checked once for the whole run: every image's replacement comes from
    them, so one unreadable file would otherwise fail every image. The others are skipped with one warning."""
    from vitcli.images import split_readable

    readable, refusals = split_readable(paths)
    named = "; ".join(refusals[:SKIPPED_NAMED])
    if len(refusals) > SKIPPED_NAMED:
        named += f"; and {len(refusals) - SKIPPED_NAMED} more"
    if not readable:
        raise UsageError(f"{described}: none of {whose} {len(paths)} images can be read: {named}")
    if refusals:
        print(
            f"warning: {described}: skipped {len(refusals)} of {len(paths)} reference images that cannot be read: "
            f"{named}",
            file=sys.stderr,
        )
    return readable
