"""One session runs every front end's Jobs: the experiments about several images together (compare, the patch pair)
and about a data folder (probe), through the Python API and `vitcli run` configs, give the command's own files.

The oracle is the file the command writes for the same images and options: the API and a config must produce the
same JSON (provenance's command line aside) and the same CSV rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas
import pytest
from PIL import Image

import vitcli
from vitcli.errors import UsageError

from configs import write_config
from conftest import RANDOM_CPU, result_files

COMPARE = """
name = "sets"
images = {images}
[model]
weights = "random"
seed = 0
device = "cpu"
[[experiments]]
command = "compare"
classes = [283, "Newfoundland dog"]
top-k = 3
pairs = "all"
"""
COMPARE_ARGUMENTS = ["--class", "283", "--class", "Newfoundland dog", "--top-k", "3", "--pairs", "all"]


@pytest.fixture(scope="module")
def model():
    return vitcli.load_model(weights="random", device="cpu")


def without_command_line(document: dict) -> dict:
    document = json.loads(json.dumps(document))
    document["provenance"].pop("command")
    return document


def the_commands_files(cli, workdir: Path, images: list[Path]) -> tuple[str, dict[str, Path]]:
    """The result name and files of `vitcli compare` on `images` with COMPARE_ARGUMENTS."""
    written = cli("compare", *images, *RANDOM_CPU, *COMPARE_ARGUMENTS, "--quiet", "-o", "single")
    assert written.exit_code == 0, written.stderr
    (document,) = (workdir / "single").rglob("compare-*.json")
    return document.stem, result_files(workdir / "single", document.stem)


def test_the_compare_api_equals_the_commands_json_and_csv(model, cli, workdir, photo, newfoundland):
    images = [photo.absolute(), newfoundland.absolute()]
    result = vitcli.compare(model, images, classes=[283, "Newfoundland dog"], top_k=3, pairs="all")
    name, files = the_commands_files(cli, workdir, images)
    assert result.name == name
    assert without_command_line(result.to_dict()) == without_command_line(json.loads(files["json"].read_text()))
    assert result.to_dict()["provenance"]["command"].startswith("vitcli.compare(model, images=[")
    pandas.testing.assert_frame_equal(result.to_frame(), pandas.read_csv(files["csv"]), check_dtype=False)
    assert [image.source.path for image in result.value.images] == images


def test_a_config_with_compare_writes_the_commands_files(cli, workdir, photo, newfoundland):
    images = [photo.absolute(), newfoundland.absolute()]
    config = write_config(workdir, images, COMPARE)
    run = cli("run", config, "--quiet")
    assert run.exit_code == 0, run.stderr
    name, single = the_commands_files(cli, workdir, images)
    ran = result_files(workdir / "outputs" / "sets", name)
    assert set(ran) == set(single) == {"json", "csv", "png"}
    assert without_command_line(json.loads(ran["json"].read_text())) == without_command_line(
        json.loads(single["json"].read_text())
    )
    assert ran["csv"].read_text() == single["csv"].read_text()
    manifest = json.loads((workdir / "outputs" / "sets" / "manifest.json").read_text())
    assert [entry["experiment"] for entry in manifest["results"]] == [name]


def test_a_config_with_compare_needs_two_images(cli, workdir, photo):
    config = write_config(workdir, [photo], COMPARE)
    refused = cli("run", config)
    assert refused.exit_code == 2
    assert refused.stderr.strip() == "error: experiments[0]: compare needs at least two images, got 1"


def test_run_experiment_points_an_experiment_about_several_images_to_its_function(model, photo):
    with pytest.raises(UsageError, match=r"call vitcli\.compare\(model, images, \.\.\.\)"):
        vitcli.run_experiment("compare", model, photo)


def test_the_compare_api_refuses_one_image_with_the_commands_message(model, photo):
    with pytest.raises(UsageError, match="compare needs at least two images, got 1"):
        vitcli.compare(model, photo)


def test_the_patch_api_equals_the_commands_json_and_csv(model, cli, workdir, photo, newfoundland):
    clean, corrupt = photo.absolute(), newfoundland.absolute()
    result = vitcli.patch(model, clean, corrupt, sites=["attention", "mlp"], method=["activation", "attribution"])
    written = cli(
        "patch",
        clean,
        corrupt,
        *RANDOM_CPU,
        "--sites",
        "attention",
        "--sites",
        "mlp",
        "--method",
        "activation",
        "--method",
        "attribution",
        "--quiet",
    )
    assert written.exit_code == 0, written.stderr
    files = result_files(workdir / "outputs", result.name)
    assert without_command_line(result.to_dict()) == without_command_line(json.loads(files["json"].read_text()))
    assert result.to_dict()["provenance"]["command"].startswith("vitcli.patch(model, clean=")
    pandas.testing.assert_frame_equal(result.to_frame(), pandas.read_csv(files["csv"]), check_dtype=False)
    assert result.to_dict()["subject"]["clean"]["path"] == str(clean)


def test_the_patch_api_refuses_what_the_command_refuses(model, photo):
    with pytest.raises(UsageError, match="CLEAN and CORRUPT are the same image"):
        vitcli.patch(model, photo, photo)
    with pytest.raises(UsageError, match="`patch` has no option 'pair'"):
        vitcli.patch(model, photo, photo, pair=[photo, photo])


PROBE = """
name = "probing"
images = {images}
[model]
weights = "random"
seed = 0
device = "cpu"
[[experiments]]
command = "probe"
data-dir = {data}
val-fraction = 0.25
split-seed = 1
"""


@pytest.fixture(scope="module")
def pets(tmp_path_factory) -> Path:
    """An ImageFolder: dog/ (reddish) and cat/ (bluish), four noisy images each."""
    root = tmp_path_factory.mktemp("pets")
    rng = np.random.default_rng(0)
    for name, colour in (("dog", (200, 60, 40)), ("cat", (40, 80, 210))):
        (root / name).mkdir()
        for index in range(4):
            pixels = np.clip(rng.normal(colour, 30, size=(48, 48, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / name / f"{name}{index}.png")
    return root


def the_probe_commands_files(cli, workdir: Path, data: Path) -> tuple[str, dict[str, Path]]:
    written = cli("probe", data, *RANDOM_CPU, "--val-fraction", "0.25", "--split-seed", "1", "--quiet", "-o", "single")
    assert written.exit_code == 0, written.stderr
    (document,) = (workdir / "single").rglob("probe-*[0-9].json")
    return document.stem, result_files(workdir / "single", document.stem)


def test_the_probe_api_equals_the_commands_json_and_csv(model, cli, workdir, pets):
    result = vitcli.probe(model, pets, val_fraction=0.25, split_seed=1)
    name, files = the_probe_commands_files(cli, workdir, pets)
    assert result.name == name
    assert without_command_line(result.to_dict()) == without_command_line(json.loads(files["json"].read_text()))
    assert result.to_dict()["provenance"]["command"].startswith("vitcli.probe(model, data_dir=")
    pandas.testing.assert_frame_equal(result.to_frame(), pandas.read_csv(files["csv"]), check_dtype=False)


def test_a_config_with_probe_writes_the_commands_files_and_checkpoint(cli, workdir, photo, pets):
    config = write_config(workdir, [photo], PROBE, data=pets)
    run = cli("run", config, "--quiet")
    assert run.exit_code == 0, run.stderr
    name, single = the_probe_commands_files(cli, workdir, pets)
    ran = result_files(workdir / "outputs" / "probing", name)
    assert without_command_line(json.loads(ran["json"].read_text())) == without_command_line(
        json.loads(single["json"].read_text())
    )
    assert ran["csv"].read_text() == single["csv"].read_text()
    checkpoints = [
        result_files(root, f"{name}-checkpoint") for root in (workdir / "outputs" / "probing", workdir / "single")
    ]
    assert checkpoints[0]["labels.txt"].read_text() == checkpoints[1]["labels.txt"].read_text() == "cat\ndog\n"
    manifest = json.loads((workdir / "outputs" / "probing" / "manifest.json").read_text())
    assert [entry["experiment"] for entry in manifest["results"]] == [name]
    again = cli("run", config, "--quiet")
    assert again.exit_code == 0, again.stderr
    assert "skipped 1 result already complete" in cli("run", config).stderr


def test_a_config_with_probe_needs_its_data_folder(cli, workdir, photo):
    config = write_config(workdir, [photo], PROBE.replace("data-dir = {data}\n", ""))
    refused = cli("run", config)
    assert refused.exit_code == 2
    assert refused.stderr.startswith("error: experiments[0]: probe in a config needs `data-dir = FOLDER`")


PATCH_SIZES = """
name = "sizes"
images = {images}
[model]
weights = "random"
seed = 0
device = "cpu"
[[experiments]]
command = "compare-patch-size"
patch-sizes = "8,32"
image-size = 64
"""
PATCH_SIZES_ARGUMENTS = ["--patch-sizes", "8,32", "--image-size", "64"]


def the_patch_size_commands_files(cli, workdir: Path) -> tuple[str, dict[str, Path]]:
    """`vitcli compare-patch-size` with PATCH_SIZES_ARGUMENTS: counted without weights."""
    written = cli("compare-patch-size", *RANDOM_CPU, *PATCH_SIZES_ARGUMENTS, "--quiet", "-o", "single")
    assert written.exit_code == 0, written.stderr
    (document,) = (workdir / "single").rglob("patch-sizes-*.json")
    return document.stem, result_files(workdir / "single", document.stem)


def test_compare_patch_size_counts_through_a_session_without_weights(cli, workdir, monkeypatch):
    import vitcli.loading
    from vitcli.session import Session

    runs = []
    real_run = Session.run
    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    monkeypatch.setattr(
        Session, "run", lambda self, jobs, *args, **kwargs: runs.append(jobs) or real_run(self, jobs, *args, **kwargs)
    )
    name, files = the_patch_size_commands_files(cli, workdir)
    assert [[job.name() for job in jobs] for jobs in runs] == [[name]]
    assert files["json"].parent.name == "model"


def test_a_session_without_weights_refuses_a_job_that_needs_them(photo):
    from vitcli.jobs.predict import predict_jobs
    from vitcli.output import Emitter, Messages
    from vitcli.runner import Publisher, Report
    from vitcli.session import Session, UnloadedModel
    from vitcli.spec import WeightsSpec
    from vitcli.store import OutputStore

    publisher = Publisher(OutputStore(photo.parent), "m", Emitter("table", True), Messages(True), {})
    session = Session(UnloadedModel(WeightsSpec(random=True), "cpu", 1), publisher)
    with pytest.raises(ValueError, match="predict needs the model's weights"):
        session.run(predict_jobs(), [photo], Report())


def test_the_compare_patch_size_api_equals_the_commands_json_and_csv(model, cli, workdir):
    result = vitcli.compare_patch_size(model, patch_sizes="8,32", image_size=64)
    name, files = the_patch_size_commands_files(cli, workdir)
    assert result.name == name
    assert without_command_line(result.to_dict()) == without_command_line(json.loads(files["json"].read_text()))
    assert result.to_dict()["provenance"]["command"].startswith("vitcli.compare_patch_size(model, patch_sizes=")
    pandas.testing.assert_frame_equal(result.to_frame(), pandas.read_csv(files["csv"]), check_dtype=False)


def test_the_compare_patch_size_api_adapts_the_checkpoint_to_an_image(model, cli, workdir, photo):
    result = vitcli.compare_patch_size(model, patch_sizes="32", image_size=64, adapt=photo.absolute())
    written = cli(
        "compare-patch-size", *RANDOM_CPU, *PATCH_SIZES_ARGUMENTS[2:], "-p", "32", "--adapt", photo.absolute()
    )
    assert written.exit_code == 0, written.stderr
    files = result_files(workdir / "outputs", result.name)
    assert without_command_line(result.to_dict()) == without_command_line(json.loads(files["json"].read_text()))
    assert result.to_dict()["subject"]["path"] == str(photo.absolute())


def test_a_config_with_compare_patch_size_writes_the_commands_files(cli, workdir, photo):
    config = write_config(workdir, [photo], PATCH_SIZES)
    run = cli("run", config, "--quiet")
    assert run.exit_code == 0, run.stderr
    name, single = the_patch_size_commands_files(cli, workdir)
    ran = result_files(workdir / "outputs" / "sizes", name)
    assert ran["json"].parent.name == "model"
    assert without_command_line(json.loads(ran["json"].read_text())) == without_command_line(
        json.loads(single["json"].read_text())
    )
    assert ran["csv"].read_text() == single["csv"].read_text()


def test_a_config_with_compare_reuses_the_images_its_per_image_experiments_prepared(
    cli, workdir, photo, newfoundland, monkeypatch
):
    from vitcli.model import VitModel

    images = [photo.absolute(), newfoundland.absolute()]
    prepared: list[Path] = []
    real_prepare = VitModel.prepare
    monkeypatch.setattr(VitModel, "prepare", lambda self, path: prepared.append(path) or real_prepare(self, path))
    config = write_config(workdir, images, COMPARE + '[[experiments]]\ncommand = "predict"\n')
    run = cli("run", config, "--quiet")
    assert run.exit_code == 0, run.stderr
    assert sorted(prepared) == sorted(images)  # each decoded and preprocessed once, for predict and compare
    name, single = the_commands_files(cli, workdir, images)
    ran = result_files(workdir / "outputs" / "sets", name)
    assert without_command_line(json.loads(ran["json"].read_text())) == without_command_line(
        json.loads(single["json"].read_text())
    )
    assert ran["csv"].read_text() == single["csv"].read_text()


PAIR = """
name = "pair"
images = {images}
[model]
weights = "random"
seed = 0
device = "cpu"
[[experiments]]
command = "patch"
clean = {clean}
corrupt = {corrupt}
sites = ["attention", "mlp"]
method = ["activation", "attribution"]
"""
PAIR_ARGUMENTS = ["--sites", "attention", "--sites", "mlp", "--method", "activation", "--method", "attribution"]


def test_a_config_with_the_patch_pair_writes_the_commands_files(cli, workdir, photo, newfoundland, persian):
    """`clean` and `corrupt` name the command line's pair: computed once, whatever the run's images (here one
    other image), and filed where `vitcli patch CLEAN CORRUPT` files it."""
    clean, corrupt = photo.absolute(), newfoundland.absolute()
    config = write_config(workdir, [persian], PAIR, clean=clean, corrupt=corrupt)
    run = cli("run", config, "--quiet")
    assert run.exit_code == 0, run.stderr
    written = cli("patch", clean, corrupt, *RANDOM_CPU, *PAIR_ARGUMENTS, "--quiet", "-o", "single")
    assert written.exit_code == 0, written.stderr
    (document,) = (workdir / "single").rglob("patch-*.json")
    single = result_files(workdir / "single", document.stem)
    ran = result_files(workdir / "outputs" / "pair", document.stem)
    assert ran["json"].parent.name == single["json"].parent.name  # the pair's folder, set-HASH
    assert without_command_line(json.loads(ran["json"].read_text())) == without_command_line(
        json.loads(single["json"].read_text())
    )
    assert ran["csv"].read_text() == single["csv"].read_text()
    manifest = json.loads((workdir / "outputs" / "pair" / "manifest.json").read_text())
    assert [entry["experiment"] for entry in manifest["results"]] == [document.stem]


def test_run_experiment_runs_the_patch_pair(model, cli, workdir, photo, newfoundland):
    clean, corrupt = photo.absolute(), newfoundland.absolute()
    result = vitcli.run_experiment("patch", model, clean=clean, corrupt=corrupt, sites="mlp")
    assert result.to_dict() == vitcli.patch(model, clean, corrupt, sites="mlp").to_dict() | {
        "provenance": result.to_dict()["provenance"]
    }
    assert result.to_dict()["subject"]["corrupt"]["path"] == str(corrupt)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ('clean = "{clean}"', "patch in a config needs `corrupt = IMAGE`"),
        ('clean = "{clean}"\ncorrupt = "{clean}"', "CLEAN and CORRUPT are the same image"),
        ('clean = "nowhere.jpg"\ncorrupt = "{clean}"', "nowhere.jpg is not an image file"),
    ],
)
def test_a_config_refuses_a_patch_pair_it_cannot_run(cli, workdir, photo, keys, message, monkeypatch):
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    experiment = keys.format(clean=photo.absolute())
    (workdir / "bad.toml").write_text(f'images = ["{photo}"]\n[[experiments]]\ncommand = "patch"\n{experiment}\n')
    refused = cli("run", workdir / "bad.toml", *RANDOM_CPU)
    assert refused.exit_code == 2
    assert refused.stderr.startswith("error: experiments[0]") and message in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
