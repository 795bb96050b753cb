"""`vitcli predict` and `vitcli patches` as users run them, the shared output conventions, and bad input."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import RANDOM_CPU
from vitcli.output import write_text

VITCLI = shutil.which("vitcli", path=str(Path(sys.executable).parent)) or "vitcli"
MODEL = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"


def read_csv(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


# ----- predict


def test_predict_table_names_the_image_the_classes_and_the_random_weights(cli, photo):
    result = cli("predict", photo, *RANDOM_CPU)
    assert result.exit_code == 0, result.stderr
    assert "synthetic.jpg" in result.stdout and "probability" in result.stdout
    assert "RANDOM (seed 0) WEIGHTS" in result.stdout
    assert "wrote outputs/predict/synthetic/predictions.csv" in result.stderr


def test_predict_without_an_image_uses_the_sample_photo(cli):
    result = cli("predict", *RANDOM_CPU, "--format", "json")
    assert result.exit_code == 0
    assert "no image given: using the sample photo" in result.stderr and "grace_hopper.jpg" in result.stderr
    document = json.loads(result.stdout)
    assert document["results"][0]["image"]["path"].endswith("grace_hopper.jpg")


def test_predict_json_carries_full_precision_and_provenance(cli, vit, photo, workdir):
    result = cli("predict", photo, *RANDOM_CPU, "--format", "json", "--top-k", "3", "-o", "run")
    document = json.loads(result.stdout)
    assert document == json.loads((workdir / "run" / "predictions.json").read_text())
    provenance = document["provenance"]
    assert provenance["model"] == MODEL
    assert provenance["weights"]["source"] == "random" and provenance["weights"]["seed"] == 0
    assert provenance["parameters_sha256"] == vit.parameter_sha256
    assert provenance["versions"]["torch"] == torch.__version__
    assert provenance["preprocessing"]["crop_pct"] == 0.9
    assert provenance["device"] == "cpu" and provenance["command"].startswith("vitcli ")
    (entry,) = document["results"]
    assert entry["image"]["sha256"] == __import__("hashlib").sha256(photo.read_bytes()).hexdigest()
    assert (entry["image"]["original_width"], entry["image"]["original_height"]) == (320, 240)
    with torch.inference_mode():
        expected = vit.net(vit.prepare(photo).input.unsqueeze(0)).softmax(-1)[0]
    for score in entry["top"]:
        assert score["probability"] == pytest.approx(float(expected[score["class_index"]]), abs=1e-7)
    rows = read_csv((workdir / "run" / "predictions.csv").read_text())
    assert [row["rank"] for row in rows] == ["1", "2", "3"]
    assert {row["weights"] for row in rows} == {"RANDOM (seed 0)"}


def test_predict_many_images_from_a_folder_and_a_glob(cli, photo, workdir):
    folder = workdir / "pics"
    folder.mkdir()
    for name in ("a.jpg", "b.png"):
        Image.open(photo).save(folder / name)
    (folder / "notes.txt").write_text("not an image")
    result = cli("predict", folder, str(folder / "*.jpg"), *RANDOM_CPU, "--format", "csv", "--top-k", "1", "--batch-size", "2")
    rows = read_csv(result.stdout)
    assert [Path(row["image"]).name for row in rows] == ["a.jpg", "b.png", "a.jpg"]
    assert (workdir / "outputs" / "predict" / "predictions.csv").is_file()


@pytest.mark.parametrize("mode", ["L", "RGBA", "P", "CMYK", "I;16", "LA"])
def test_other_image_modes_are_converted_to_rgb(cli, photo, workdir, mode):
    rgb = Image.open(photo).convert("RGB")
    if mode == "I;16":
        array = (np.asarray(rgb.convert("L"), dtype=np.uint16) * 257).astype(np.uint16)
        image = Image.fromarray(array)
    else:
        image = rgb.convert(mode)
    path = workdir / f"converted.{'jpg' if mode in ('L', 'CMYK') else 'png'}"
    image.save(path)
    result = cli("predict", path, *RANDOM_CPU, "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["results"][0]["image"]["original_mode"] in (mode, "I")


def test_sixteen_bit_images_keep_their_full_range(vit, workdir):
    ramp = np.tile(np.linspace(0, 65535, 256).astype(np.uint16), (256, 1))
    Image.fromarray(ramp).save(workdir / "ramp16.png")
    crop = vit.prepare(workdir / "ramp16.png").crop
    assert crop.min() < 0.1 and crop.max() > 0.9


# ----- patches


def test_patches_numbering_projection_check_and_files(cli, vit, newfoundland, workdir):
    result = cli("patches", newfoundland, *RANDOM_CPU, "--patch", "63", "-o", "out")
    assert result.exit_code == 0, result.stderr
    assert "P63 = token 63: row 4, col 6 zero-based (row 5, col 7 from one)" in result.stdout
    assert "max |X W_E + b_E - Conv2d|" in result.stdout
    rows = read_csv((workdir / "out" / "patches.csv").read_text())
    assert len(rows) == 196
    p63 = rows[62]
    assert (p63["patch"], p63["token"], p63["row"], p63["col"]) == ("P63", "63", "4", "6")
    assert (p63["left"], p63["top"], p63["right"], p63["bottom"]) == ("96", "64", "112", "80")
    document = json.loads((workdir / "out" / "patches.json").read_text())
    grid = document["results"][0]["grid"]
    assert (grid["grid_rows"], grid["grid_cols"], grid["patches"], grid["rows_with_prefix"]) == (14, 14, 196, 197)
    assert grid["projection_max_abs_difference_vs_conv2d"] < 1e-5
    (detail,) = document["results"][0]["selected"]
    assert [len(detail[key]) for key in ("pixels", "projection", "position_embedding", "block1_input")] == [768, 192, 192, 192]
    # Independent oracle: the Conv2d's output for P63 plus the position embedding of token 63.
    image = vit.prepare(newfoundland).input.unsqueeze(0)
    with torch.inference_mode():
        conv = vit.net.patch_embed.proj(image).flatten(2)[0, :, 62]
        position = vit.net.pos_embed[0, 63].detach()
    assert np.allclose(detail["projection"], conv.numpy(), atol=1e-5)
    assert np.allclose(detail["block1_input"], (conv + position).numpy(), atol=1e-5)
    assert float(p63["proj_0"]) == pytest.approx(float(conv[0]), abs=1e-5)
    with Image.open(workdir / "out" / "patches.png") as png:
        assert png.size[0] > 500


def test_patches_accepts_a_grid_position_and_csv_on_stdout(cli, photo):
    result = cli("patches", photo, *RANDOM_CPU, "--patch", "r4c6", "--format", "csv", "--values", "3")
    rows = read_csv(result.stdout)
    assert len(rows) == 196 and "proj_2" in rows[0] and "proj_3" not in rows[0]
    json_result = cli("patches", photo, *RANDOM_CPU, "--patch", "r4c6", "--format", "json", "-q")
    assert json.loads(json_result.stdout)["results"][0]["selected"][0]["patch"] == "P63"


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ("P300", "patch P300 does not exist: patches are P1..P196 or r0c0..r13c13"),
        ("0", "patch 0 does not exist"),
        ("r14c0", "grid position r14c0 is outside the 14x14 grid"),
        ("x7", "cannot read patch 'x7'"),
    ],
)
def test_patches_rejects_patches_outside_the_grid(cli, photo, patch, message):
    result = cli("patches", photo, *RANDOM_CPU, "--patch", patch)
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: {message}" or message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


# ----- bad input: one line on stderr, non-zero exit, no traceback


def bad_inputs(folder: Path, photo: Path) -> dict[str, tuple[list[str], int, str]]:
    (folder / "empty").mkdir()
    (folder / "notes.jpg").write_text("this is text, not a JPEG")
    data = photo.read_bytes()
    (folder / "truncated.jpg").write_bytes(data[: len(data) // 2])
    (folder / "a_file").write_text("")
    return {
        "missing file": (["predict", str(folder / "nope.jpg")], 1, "no such file or directory"),
        "empty folder": (["predict", str(folder / "empty")], 1, "no images in directory"),
        "not an image": (["predict", str(folder / "notes.jpg")], 1, "is not an image that Pillow can read"),
        "truncated": (["predict", str(folder / "truncated.jpg")], 1, "is damaged or truncated"),
        "unknown model": (["predict", str(photo), "--model", "vit_tiny_patch16_999"], 2, "unknown model name"),
        "not a vit": (["predict", str(photo), "--model", "resnet18"], 2, "not a Vision Transformer"),
        "unwritable output": (["predict", str(photo), "-o", str(folder / "a_file" / "sub")], 1, "cannot create output directory"),
        "top-k range": (["predict", str(photo), "--top-k", "1001"], 2, "--top-k must be between 1 and 1000"),
        "glob matches nothing": (["predict", str(folder / "*.png")], 1, "no files match"),
    }


def test_asking_for_a_missing_gpu_is_an_error(cli, photo):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    result = cli("predict", photo, "--weights", "random", "--device", "cuda")
    assert result.exit_code == 1 and "no CUDA GPU is available" in result.stderr


def test_bad_inputs_get_one_line_and_an_exit_code(cli, photo, workdir):
    for name, (args, code, message) in bad_inputs(workdir, photo).items():
        result = cli(*args, *RANDOM_CPU)
        assert result.exit_code == code, name
        assert message in result.stderr, (name, result.stderr)
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, name
        assert result.stdout == "", name


def test_debug_shows_the_traceback(cli, workdir):
    result = cli("predict", workdir / "nope.jpg", *RANDOM_CPU, "--debug")
    assert result.exit_code == 1 and "Traceback" in result.stderr


def test_enormous_images_are_refused(cli, photo, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    result = cli("predict", photo, *RANDOM_CPU)
    assert result.exit_code == 1 and "is too large to decode safely" in result.stderr


def test_checkpoint_whose_shapes_do_not_match(cli, vit, photo, workdir):
    from safetensors.torch import save_file

    state = {name: tensor.clone() for name, tensor in vit.net.state_dict().items()}
    state["pos_embed"] = torch.zeros(1, 50, 192)
    save_file(state, workdir / "wrong.safetensors")
    result = cli("predict", photo, "--checkpoint", workdir / "wrong.safetensors", "--device", "cpu")
    assert result.exit_code == 1
    assert "does not match vit_tiny_patch16_224.augreg_in21k_ft_in1k: 1 shape mismatches (e.g. pos_embed" in result.stderr
    contradiction = cli("predict", photo, "--checkpoint", workdir / "wrong.safetensors", "--weights", "random")
    assert contradiction.exit_code == 2 and "contradict" in contradiction.stderr


def test_a_checkpoint_file_gives_the_same_numbers_as_the_same_weights_in_memory(cli, vit, photo, workdir):
    torch.save(vit.net.state_dict(), workdir / "tiny.pth")
    from_file = json.loads(cli("predict", photo, "--checkpoint", workdir / "tiny.pth", "--device", "cpu", "-f", "json").stdout)
    in_memory = json.loads(cli("predict", photo, *RANDOM_CPU, "-f", "json").stdout)
    assert from_file["provenance"]["parameters_sha256"] == vit.parameter_sha256
    assert from_file["provenance"]["weights"]["source"] == "checkpoint"
    assert from_file["results"][0]["top"] == in_memory["results"][0]["top"]


def test_a_failed_write_leaves_no_file(tmp_path):
    target = tmp_path / "table.csv"

    def fail_midway(stream):
        stream.write(b"half a ")
        raise OSError("disk full")

    from vitcli.output import atomic_write

    with pytest.raises(OSError):
        atomic_write(target, fail_midway)
    assert list(tmp_path.iterdir()) == []
    write_text(target, "whole\n")
    assert target.read_text() == "whole\n"


# ----- the installed entry point, as a real subprocess


def run_vitcli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([VITCLI, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


def test_help_is_fast_because_it_imports_no_torch():
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, vitcli.cli; print(sorted({'torch', 'timm', 'matplotlib', 'numpy'} & set(sys.modules)))"],
        capture_output=True, text=True, check=True,
    )
    assert probe.stdout.strip() == "[]"
    result = run_vitcli("--help")
    assert result.returncode == 0
    for command in ("predict", "patches", "attend", "occlude-patches", "occlude-quadrants", "compare-patch-size"):
        assert command in result.stdout


def test_installed_entry_point_predicts_and_reports_usage_errors_in_one_line(photo, tmp_path):
    result = run_vitcli("predict", str(photo), *RANDOM_CPU, "--format", "json", "--top-k", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["results"][0]["top"]) == 2
    usage = run_vitcli("predict", "--top-k", "two", cwd=tmp_path)
    assert usage.returncode == 2
    assert usage.stderr.count("\n") == 1 and "Invalid value for '--top-k'" in usage.stderr


def write_hf_cache(home: Path, state: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = home / "hub" / f"models--timm--{MODEL}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    save_file(state, snapshot / "model.safetensors")


def test_pretrained_weights_load_offline_from_the_hugging_face_cache(vit, photo, tmp_path):
    torch.manual_seed(123)
    state = {name: torch.randn_like(tensor) * 0.02 for name, tensor in vit.net.state_dict().items()}
    write_hf_cache(tmp_path / "hf", state)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    result = run_vitcli("predict", str(photo), "--device", "cpu", "--format", "json", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["provenance"]["weights"]["source"] == "pretrained"
    from vitcli.model import state_dict_sha256

    assert document["provenance"]["parameters_sha256"] == state_dict_sha256(state)
    assert "RANDOM" not in result.stdout


def test_missing_pretrained_weights_name_the_three_ways_to_supply_them(photo, tmp_path):
    env = {**os.environ, "HF_HOME": str(tmp_path / "empty-hf"), "HF_HUB_OFFLINE": "1"}
    result = run_vitcli("predict", str(photo), "--device", "cpu", env=env, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    for way in ("Hugging Face cache", "--checkpoint PATH", "--weights random"):
        assert way in result.stderr
