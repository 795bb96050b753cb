"""Run configs for tests: each test keeps its own config text; this writes it with its values filled in."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path


def write_config(
    folder: Path, images: Sequence[Path | str], text: str, name: str = "run.toml", **values: object
) -> Path:
    """`text` written to FOLDER/NAME with `{images}` as a TOML array of the images' paths and every other `{field}` as
    a TOML string of its value (JSON's quoting is TOML's for these)."""
    path = folder / name
    strings = {field: json.dumps(str(value)) for field, value in values.items()}
    path.write_text(text.format(images=json.dumps([str(image) for image in images]), **strings), encoding="utf-8")
    return path
