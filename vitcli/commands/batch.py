from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from vitcli.context import CommandContext
from vitcli.shell import build_context, vitcli_command


@vitcli_command(
    "run",
    reads_config=True,
    examples=[
        "vitcli run configs/lecture.toml",
        "vitcli run configs/lecture.toml examples/images/Persian_98.jpg --weights random",
        "vitcli run configs/sweep.toml photos/ --shard 1/4 --format jsonl > shard1.jsonl",
    ],
)
def run_command(
    context: CommandContext,
    config: Annotated[
        Path, typer.Argument(metavar="CONFIG", help="A TOML config: model, images and \\[\\[experiments]] tables.")
    ],
    images: Annotated[
        list[str] | None,
        typer.Argument(metavar="IMAGE", help="Images that replace the config's images.", show_default=False),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Redo every result, even those a previous run of the config completed.")
    ] = False,
) -> None:
    """Run a config's experiments over its images in one process: the model loads once, each image is read once.

    Results land in OUTPUT/NAME/: the single commands' files, manifest.json and summary.csv (one row per image).
    Options given here override the config's \\[model] and \\[output]; a re-run skips finished results.
    """
    from vitcli.batch.config import load_config
    from vitcli.batch.execute import execute

    loaded = load_config(config)
    settings: dict[str, Any] = {**context.option_values, **loaded.model_options_under(context.explicit_options)}
    if loaded.output_dir is not None:
        settings["output_dir"] = Path(loaded.output_dir)
    if loaded.figures is not None:
        settings["figures"] = loaded.figures
    settings.update(context.explicit_options)
    for key in ("checkpoint", "labels_file"):
        if isinstance(settings[key], str):
            settings[key] = Path(settings[key])
    seed_name = "--seed" if "seed" in context.explicit_options else "model.seed"
    run_context = build_context("run", **settings, seed_name=seed_name)
    run_context.explicit_options = context.explicit_options
    run_context.emitter.tidy_csv = True
    run_context.emitter.show_tables = False
    report = execute(run_context, loaded, images, force)
    run_context.emitter.finish()
    run_context.finish(report)


@vitcli_command(
    "merge",
    options=("quiet", "debug"),
    examples=[
        "vitcli merge outputs/sweep",
        "vitcli merge machine1/outputs/sweep machine2/outputs/sweep --into outputs/sweep-all",
    ],
)
def merge_command(
    context: CommandContext,
    runs: Annotated[list[Path], typer.Argument(metavar="RUN_DIR...", help="Folders of `vitcli run` (OUTPUT/NAME).")],
    into: Annotated[
        Path | None,
        typer.Option("--into", help="Where the merged manifest.json and summary.csv go (default: the first RUN_DIR)."),
    ] = None,
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            metavar="PATH|IDENTITY",
            help="Merge only the runs of this config: its file's path as the runs recorded it, or its identity "
            "(6 or more leading hex digits, as manifest.json and the refusal show). Needed where a RUN_DIR holds "
            "records of several configs.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Combine the manifests and summaries of shards (or of any runs of one config) into one."""
    from vitcli.batch.execute import merge_folders
    from vitcli.errors import UsageError
    from vitcli.output import counted

    for folder in runs:
        if not folder.is_dir():
            raise UsageError(f"{folder} is not a folder")
    if into is not None and (into.exists() and not into.is_dir() or not str(into).strip()):
        raise UsageError(f"--into {into} is {'empty' if not str(into).strip() else 'a file'}: give a folder")
    context.emitter.show_tables = False
    if config is not None and not config.strip():
        raise UsageError("--config is empty: give a config file's path or an identity")
    merged, written = merge_folders(context, runs, into or runs[0], config)
    images = len({entry["image"] for entry in merged.results if entry["image"]})
    context.messages.info(
        f"merged {counted(len(merged.results), 'result')} of {counted(images, 'image')}; wrote "
        + ", ".join(map(str, written))
    )
    if merged.failures:
        remain = "remains" if len(merged.failures) == 1 else "remain"
        context.messages.warn(f"{counted(len(merged.failures), 'failure')} {remain} (see the merged manifest)")
