"""`vitcli predict` as users run it: tables, JSON and CSV against the model's own forward, folders and globs, image
modes, checkpoints."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import RANDOM_CPU, result_files

MODEL = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"


def read_csv(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_predict_table_names_the_image_the_classes_and_the_random_weights(cli, photo):
    result = cli("predict", photo, *RANDOM_CPU)
    assert result.exit_code == 0, result.stderr
    assert "synthetic.jpg" in result.stdout and "probability" in result.stdout
    assert "RANDOM (seed 0) WEIGHTS" in result.stdout
    assert (
        result.stderr.startswith(f"wrote outputs/{MODEL}-random-s0/synthetic-") and "/predict-k5.json" in result.stderr
    )


def test_predict_without_an_image_uses_the_sample_photo(cli):
    result = cli("predict", *RANDOM_CPU, "--format", "json")
    assert result.exit_code == 0
    assert "no image given: using the sample photo" in result.stderr and "grace_hopper.jpg" in result.stderr
    document = json.loads(result.stdout)
    assert document["results"][0]["subject"]["path"].endswith("grace_hopper.jpg")


def test_predict_json_carries_full_precision_and_provenance(cli, vit, photo, workdir):
    result = cli("predict", photo, *RANDOM_CPU, "--format", "json", "--top-k", "3", "-o", "run")
    assert result.exit_code == 0, result.stderr
    (document,) = json.loads(result.stdout)["results"]
    files = result_files(workdir / "run", "predict-k3")
    assert document == json.loads(files["json"].read_text())
    provenance = document["provenance"]
    assert provenance["model"] == MODEL
    assert provenance["weights"]["source"] == "random" and provenance["weights"]["seed"] == 0
    assert provenance["parameters_sha256"] == vit.parameter_sha256
    assert provenance["versions"]["torch"] == torch.__version__
    assert provenance["preprocessing"]["crop_pct"] == 0.9
    assert provenance["device"] == "cpu" and provenance["command"].startswith("vitcli ")
    image = document["subject"]
    assert image["sha256"] == hashlib.sha256(photo.read_bytes()).hexdigest()
    assert (image["original_width"], image["original_height"]) == (320, 240)
    assert document["experiment"] == {"command": "predict", "name": "predict-k3", "settings": {"top_k": 3}}
    # Oracle: timm's own forward of the same input, softmax over all 1000 classes.
    with torch.inference_mode():
        expected = vit.net(vit.prepare(photo).input.unsqueeze(0)).softmax(-1)[0]
    top = document["result"]["top"]
    assert [score["class_index"] for score in top] == expected.topk(3).indices.tolist()
    for score in top:
        assert score["probability"] == pytest.approx(float(expected[score["class_index"]]), abs=1e-7)
    rows = read_csv(files["csv"].read_text())
    assert [row["rank"] for row in rows] == ["1", "2", "3"]
    assert {row["weights"] for row in rows} == {"RANDOM (seed 0)"}
    assert {row["image"] for row in rows} == {str(photo)}


def test_predict_many_images_from_a_folder_and_a_glob(cli, photo, workdir):
    folder = workdir / "pics"
    folder.mkdir()
    for name in ("a.jpg", "b.png"):
        Image.open(photo).save(folder / name)
    (folder / "notes.txt").write_text("not an image")
    result = cli(
        "predict", folder, str(folder / "*.jpg"), *RANDOM_CPU, "--format", "csv", "--top-k", "1", "--batch-size", "2"
    )
    assert result.exit_code == 0, result.stderr
    # a.jpg is named twice (the folder and the glob) and predicted once.
    assert [Path(row["image"]).name for row in read_csv(result.stdout)] == ["a.jpg", "b.png"]
    assert len(list((workdir / "outputs").glob("*/*/predict-k1.csv"))) == 2
    assert result.stderr.splitlines()[-1] == "2 of 2 images done"


@pytest.mark.parametrize("mode", ["L", "RGBA", "P", "CMYK", "I;16", "LA"])
def test_other_image_modes_are_converted_to_rgb(cli, photo, workdir, mode):
    rgb = Image.open(photo).convert("RGB")
    if mode == "I;16":
        image = Image.fromarray((np.asarray(rgb.convert("L"), dtype=np.uint16) * 257).astype(np.uint16))
    else:
        image = rgb.convert(mode)
    path = workdir / f"converted.{'jpg' if mode in ('L', 'CMYK') else 'png'}"
    image.save(path)
    result = cli("predict", path, *RANDOM_CPU, "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["results"][0]["subject"]["original_mode"] in (mode, "I")


def test_sixteen_bit_images_keep_their_full_range(vit, workdir):
    ramp = np.tile(np.linspace(0, 65535, 256).astype(np.uint16), (256, 1))
    Image.fromarray(ramp).save(workdir / "ramp16.png")
    crop = vit.prepare(workdir / "ramp16.png").crop
    assert crop.min() < 0.1 and crop.max() > 0.9


def test_a_checkpoint_file_gives_the_same_numbers_as_the_same_weights_in_memory(cli, vit, photo, workdir):
    torch.save(vit.net.state_dict(), workdir / "tiny.pth")
    from_file = cli("predict", photo, "--checkpoint", workdir / "tiny.pth", "--device", "cpu", "-f", "json")
    assert from_file.exit_code == 0, from_file.stderr
    (checkpoint_document,) = json.loads(from_file.stdout)["results"]
    (memory_document,) = json.loads(cli("predict", photo, *RANDOM_CPU, "-f", "json").stdout)["results"]
    assert checkpoint_document["provenance"]["parameters_sha256"] == vit.parameter_sha256
    assert checkpoint_document["provenance"]["weights"]["source"] == "checkpoint"
    assert checkpoint_document["result"]["top"] == memory_document["result"]["top"]
    # Results of other weights go to their own model folder: checkpoint stem and the file's SHA-256.
    digest = hashlib.sha256((workdir / "tiny.pth").read_bytes()).hexdigest()[:8]
    assert sorted(path.name for path in (workdir / "outputs").iterdir()) == [
        f"{MODEL}-ckpt-tiny-{digest}",
        f"{MODEL}-random-s0",
    ]
