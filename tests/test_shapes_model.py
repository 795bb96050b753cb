"""The shipped shapes model (vitcli.shapes_model): `--model shapes` resolves to it, its files are what the docs say,
it classifies scenes training never saw, and its training script is reproducible."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from vitcli import scenes, shapes_model, shapes_training
from vitcli.scenes import CLASS_NAMES
from vitcli.spec import WeightsSpec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "images" / "shapes"
HELD_OUT_SERIES = 4242  # neither the training series (1) nor the record's evaluation series (9001)
HELD_OUT_COUNT = 500


def test_the_alias_names_the_architecture_and_the_shipped_checkpoint(tmp_path):
    shipped = WeightsSpec(model_name="shapes")
    assert (shipped.model_name, shipped.checkpoint) == (shapes_model.ARCHITECTURE, shapes_model.CHECKPOINT)
    assert WeightsSpec(model_name=shapes_model.ARCHITECTURE).checkpoint == shapes_model.CHECKPOINT
    untrained = WeightsSpec(model_name="shapes", random=True)
    assert (untrained.model_name, untrained.checkpoint) == (shapes_model.ARCHITECTURE, None)
    own = tmp_path / "mine.safetensors"
    assert WeightsSpec(model_name="shapes", checkpoint=own).checkpoint == own
    assert WeightsSpec().checkpoint is None  # other models are left alone


def test_the_shipped_files_are_small_half_precision_and_labelled():
    from safetensors import safe_open

    assert shapes_model.CHECKPOINT.stat().st_size <= 5 * 1024 * 1024
    with safe_open(str(shapes_model.CHECKPOINT), "pt") as file:
        assert {file.get_slice(key).get_dtype() for key in file.keys()} == {"F16"}
    names = shapes_model.LABELS.read_text(encoding="utf-8").split("\n")
    assert tuple(names[:-1]) == CLASS_NAMES and names[-1] == ""
    record = json.loads(shapes_model.RECORD.read_text(encoding="utf-8"))
    assert record["model"] == shapes_model.ARCHITECTURE
    assert record["settings"] == {**record["settings"], **shapes_training.asdict(shapes_training.TrainingSettings())}
    assert record["held_out"]["seed"] != record["settings"]["data_seed"]


@pytest.fixture(scope="module")
def held_out_accuracy(tmp_path_factory) -> float:
    """Accuracy measured here, not read from the record: 500 fresh scenes of another series, each written as a PNG
    and read back through the model's own preprocessing (vitcli's, which must equal the training's)."""
    from vitcli.loading import load_model

    model = load_model(WeightsSpec(model_name="shapes"), "cpu")
    assert model.labels == list(CLASS_NAMES)
    folder = tmp_path_factory.mktemp("held-out")
    inputs, labels = [], []
    for index, item in enumerate(scenes.scenes(HELD_OUT_SERIES, HELD_OUT_COUNT)):
        path = folder / f"{index}.png"
        path.write_bytes(scenes.png_bytes(item.image))
        prepared = model.prepare(path)
        if index < 5:  # the preprocessing is the training's: pixels scaled to [-1, 1], nothing resized
            expected = torch.from_numpy(item.image).permute(2, 0, 1).float() / 255 * 2 - 1
            torch.testing.assert_close(prepared.input, expected, atol=1e-6, rtol=0)
        inputs.append(prepared.input)
        labels.append(item.label)
    predicted = torch.cat([model.logits(chunk) for chunk in torch.stack(inputs).split(64)]).argmax(dim=1).numpy()
    return float(np.mean(predicted == np.array(labels)))


@pytest.mark.slow  # 500 scenes through vitcli's own preprocessing and forward: about 40 s on a busy machine
def test_the_shipped_model_is_far_better_than_chance_on_scenes_training_never_saw(held_out_accuracy):
    chance = 1 / len(CLASS_NAMES)
    spread = math.sqrt(chance * (1 - chance) / HELD_OUT_COUNT)  # a guessing model's standard error
    assert held_out_accuracy > chance + 5 * spread


@pytest.mark.slow
def test_the_shipped_model_reaches_the_issues_accuracy(held_out_accuracy):
    assert held_out_accuracy >= 0.95  # issue 32: at least 0.95 on scenes training never saw


def test_predict_with_the_shipped_model_runs_offline(cli, workdir):
    result = cli("predict", EXAMPLES / "star.png", "--model", "shapes", "--device", "cpu", "--format", "json")
    assert result.exit_code == 0, result.stderr
    top = json.loads(result.stdout)["results"][0]["result"]["top"]
    assert {row["label"] for row in top} <= set(CLASS_NAMES)


@pytest.mark.slow  # two trainings of 3 steps: about 10 s on a busy machine
def test_two_short_trainings_with_one_seed_give_the_same_weights():
    """Bitwise: seeded initial weights and data, deterministic kernels on a fixed number of threads."""
    settings = shapes_training.TrainingSettings(
        steps=3, batch_size=4, warmup_steps=2, eval_count=4, threads=1, kept_tokens=40, full_steps=1
    )  # two object-centred steps, then one on every patch
    first, record = shapes_training.train(settings)
    second, _ = shapes_training.train(settings)
    for (name, value), other in zip(first.state_dict().items(), second.state_dict().values(), strict=True):
        assert torch.equal(value, other), name
    untrained = shapes_training.build(settings)
    assert not torch.equal(first.state_dict()["head.weight"], untrained.state_dict()["head.weight"])
    assert record["scenes_seen"] == 12 and record["held_out"]["count"] == 4


@pytest.mark.slow  # builds a wheel: several seconds
def test_a_wheel_carries_the_shipped_model(tmp_path):
    """Built like tests/test_explorer_script.py's wheel, from a copy of the source: the checkpoint, its labels and its
    record are package data, so an installed vitcli has `--model shapes`."""
    repo = Path(__file__).resolve().parents[1]
    source = tmp_path / "source"
    shutil.copytree(repo / "vitcli", source / "vitcli", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(repo / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "--quiet"]
    wheels = tmp_path / "wheels"
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(wheels), str(source)]
    subprocess.run(build, check=True, timeout=300)
    (wheel,) = wheels.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for shipped in (shapes_model.CHECKPOINT, shapes_model.LABELS, shapes_model.RECORD):
        assert f"vitcli/models/{shipped.name}" in names
