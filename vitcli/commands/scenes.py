"""`vitcli scenes`: write generated scenes with their masks and labels (vitcli.scenes) into the output folder."""

from __future__ import annotations

from typing import Annotated

import typer

from vitcli.context import CommandContext
from vitcli.shell import vitcli_command
from vitcli.spec import check_count

MAX_SCENES = 1_000_000  # about 100 GB of PNGs; more is surely a typo
MAX_SEED = 2**63 - 1


@vitcli_command(
    "scenes",
    options=("output_dir", "quiet", "debug"),
    examples=[
        "vitcli scenes --count 20",
        "vitcli scenes --count 100 --kind mosaic --seed 7 --output-dir data",
    ],
)
def scenes_command(
    context: CommandContext,
    count: Annotated[int, typer.Option("--count", "-n", help="How many scenes: 0 .. N-1 of the series.")] = 20,
    series: Annotated[
        int, typer.Option("--seed", help="The series: scene i of series S is the same on every run and machine.")
    ] = 0,
    kind: Annotated[
        str,
        typer.Option(
            "--kind",
            help="single: one object on clutter; mosaic: 2x2 scenes, the target class in two quadrants (Focus); "
            "bam: an object pasted on another scene's clutter.",
        ),
    ] = "single",
) -> None:
    """Generated scenes with known object masks (the shapes model's classes): OUTPUT_DIR/scenes-KIND-sSEED/ with
    NAME.png, masks/NAME.png (0 and 255) and labels.csv (file, label, class, kind, quadrants). No model is loaded.
    """
    from vitcli.errors import UsageError
    from vitcli.scenes import KINDS, write_folder  # numpy and PIL: not on every command's start-up path

    check_count("--count", count, 1, MAX_SCENES, "scenes written in one call")
    check_count("--seed", series, 0, MAX_SEED, "a scene series")
    if kind not in KINDS:
        raise UsageError(f"--kind {kind!r} is not a scene kind: one of {', '.join(KINDS)}")
    folder = context.output_dir / f"scenes-{kind}-s{series}"
    write_folder(folder, series, count, kind)
    context.messages.info(
        f"wrote {count} {kind} scene{'s' if count != 1 else ''} with masks and labels.csv to {folder}"
    )
