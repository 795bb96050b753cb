from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vitcli.shell import CommandContext, ImagesArgument, vitcli_command


@vitcli_command("predict")
def predict_command(
    context: CommandContext,
    images: ImagesArgument = None,
    top_k: Annotated[int, typer.Option("--top-k", "-k", help="How many classes to list per image.")] = 5,
) -> None:
    """Top-k ImageNet classes with probabilities, for one image or many (batched)."""
    from vitcli.output import run_document, write_csv, write_json
    from vitcli.predict import predict

    paths = context.images(images)
    model = context.model()
    predictions = predict(model, paths, top_k)
    provenance = context.provenance(model)
    folder = context.output.directory(
        context.output.options.output_dir or Path("outputs", "predict", *([paths[0].stem] if len(paths) == 1 else []))
    )
    context.output.wrote(
        [
            write_csv(folder / "predictions.csv", [row for prediction in predictions for row in prediction.rows()]),
            write_json(folder / "predictions.json", run_document(predictions, provenance)),
        ]
    )
    context.output.emit(predictions, provenance)
