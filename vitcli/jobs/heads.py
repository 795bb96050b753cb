"""`vitcli heads`: the heads of an image-text model's last blocks described by texts (TextSpan), over a set of images.

One result about the images together (a `set-...` subject, like anatomy's image views). The bank's text embeddings
are computed once and kept in the output store beside the model's results (subject `text-embeddings`), keyed by the
bank file's SHA-256 and the weights' parameter SHA-256: a later run with the same bank and weights reads them back.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from vitcli.errors import UsageError, VitcliError
from vitcli.jobs import Job, Presentation, builds_jobs
from vitcli.naming import result_name, setting
from vitcli.text_bank import TextBank, read_text_bank

# The same as vitcli.experiments.heads' (which imports torch: commands start without it).
DEFAULT_BLOCKS = 4
DEFAULT_K = 5
MIN_IMAGES = 2  # a head's variance is over the images
CACHE_SUBJECT = "text-embeddings"


@dataclass(frozen=True)
class HeadsPlan:
    """The heads described, resolved against the model's depth (HeadsJob.plan)."""

    blocks: int  # this many last blocks


class HeadsJob(Job):
    command = "heads"
    needs_classes = False  # texts take the classes' place
    scope = "set"

    def __init__(self, bank: TextBank, blocks: int | None = None, k: int = DEFAULT_K, planned: HeadsPlan | None = None):
        if blocks is not None and blocks < 1:
            raise UsageError(f"--blocks must be at least 1, not {blocks}")
        if k < 1:
            raise UsageError(f"--k must be at least 1, not {k}")
        self.bank = bank
        self.blocks = blocks  # None: the last DEFAULT_BLOCKS, or every block of a shallower model
        self.k = k
        self._planned = planned
        self.publisher: Any = None  # where the text embeddings are cached; attach() sets it

    def name(self) -> str:
        return result_name(
            "heads", setting("b", self.planned.blocks), setting("k", self.k), f"t{self.bank.sha256[:10]}"
        )

    def settings(self) -> dict[str, Any]:
        return {
            "texts": str(self.bank.path),
            "texts_sha256": self.bank.sha256,
            "blocks": self.planned.blocks,
            "k": self.k,
        }

    def plan(self, architecture: Any) -> HeadsJob:
        if self.blocks is not None and self.blocks > architecture.depth:
            raise UsageError(f"--blocks {self.blocks}: {architecture.name} has {architecture.depth} blocks")
        described = min(DEFAULT_BLOCKS, architecture.depth) if self.blocks is None else self.blocks
        return HeadsJob(self.bank, self.blocks, self.k, HeadsPlan(described))

    def check_images(self, count: int) -> None:
        if count < MIN_IMAGES:
            raise UsageError(
                f"heads describes what varies over the images: give at least {MIN_IMAGES} (dozens or more), not {count}"
            )

    def check_texts(self, model: Any) -> None:
        """Refuse (exit 2) a loaded model without its text side, or a text longer than its tokenizer's context."""
        if model.text is None:
            raise UsageError(f"{model.name} loaded without a text tower (an image tower's checkpoint brings none)")
        model.text.check(self.bank.texts, "--texts")

    def attach(self, publisher: Any) -> None:
        self.publisher = publisher

    def compute_set(self, model: Any, paths: list[Path], steps: Any) -> Any:
        from vitcli.experiments.heads import describe_heads

        embeddings, cached = self._text_embeddings(model)
        skipped: list[str] = []

        def readable() -> Iterator[Any]:
            """The images that decode; one that does not is left out of the set, its one-line refusal kept."""
            for path in paths:
                try:
                    yield model.prepare(path)
                except VitcliError as error:
                    skipped.append(str(error))

        steps.start(len(paths), "images (one forward each)")
        done = [0]

        def advance(count: int) -> None:
            steps.advance(count - done[0])
            done[0] = count

        result = describe_heads(model, readable(), self.bank, embeddings, self.planned.blocks, self.k, cached, advance)
        result.skipped = skipped
        return result

    def _text_embeddings(self, model: Any) -> tuple[Any, bool]:
        """The bank's embeddings and whether they came from the store (computed and stored otherwise)."""
        from vitcli.experiments.heads import encode_bank

        if self.publisher is None:  # the Python API: no store
            return encode_bank(model, self.bank.texts), False
        store = self.publisher.store
        folder = self.publisher.folder(CACHE_SUBJECT)
        name = f"texts-{self.bank.sha256[:16]}-{model.parameter_sha256[:16]}"
        if store.is_complete(folder, name):
            from safetensors.torch import load_file

            embeddings = load_file(str(folder / f"{name}.safetensors"))["embeddings"]
            if embeddings.shape[0] == len(self.bank.texts):
                return embeddings, True
        embeddings = encode_bank(model, self.bank.texts)
        from safetensors.torch import save

        from vitcli.store import ResultFiles

        record = {"command": "heads", "contents": f"{model.name} text embeddings of {self.bank.path.name}"}
        data = save({"embeddings": embeddings.contiguous()}, metadata={"texts_sha256": self.bank.sha256})
        store.write(folder, ResultFiles(name, {"safetensors": data}, record))
        return embeddings, False

    def present(self, result: Any) -> Presentation:
        from vitcli.presentation import heads as view

        return Presentation.of(view, result)


@builds_jobs("heads")
def heads_jobs(
    texts: Annotated[
        Path | None,
        typer.Option("--texts", help="The text bank: a UTF-8 file, one text per line.", show_default=False),
    ] = None,
    blocks: Annotated[
        int | None,
        typer.Option(
            "--blocks",
            help=f"Describe the heads of this many last blocks (default {DEFAULT_BLOCKS} as in the paper, or all if "
            "fewer).",
            show_default=False,
        ),
    ] = None,
    k: Annotated[
        int, typer.Option("--k", help="Texts per head, chosen greedily by the variance they explain.")
    ] = DEFAULT_K,
) -> list[Job]:
    if texts is None:
        raise UsageError('heads needs a text bank: --texts FILE (`texts = "FILE"` in a config), one text per line')
    return [HeadsJob(read_text_bank(Path(texts)), blocks, k)]
