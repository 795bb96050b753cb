"""`vitcli anatomy` as users run it: each view's files hold the computation's numbers, the refusals, a `vitcli run`
config, the report, and the Python API's DataFrames. The numbers themselves are checked in test_anatomy_math.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas
import pytest
from PIL import Image

from tests.conftest import EXAMPLES, RANDOM_CPU, result_files

MODEL_FOLDER = "vit_tiny_patch16_224.augreg_in21k_ft_in1k-random-s0"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Four images (the two photos and two noise images): the fewest CKA's unbiased estimator takes."""
    root = tmp_path_factory.mktemp("anatomy-images")
    for photo in ("newfoundland_31.jpg", "Persian_98.jpg"):
        shutil.copy(EXAMPLES / photo, root / photo)
    rng = np.random.default_rng(0)
    for index in range(2):
        Image.fromarray((rng.random((180, 240, 3)) * 255).astype(np.uint8)).save(root / f"noise{index}.png")
    return root


@pytest.fixture(scope="module")
def measured(vit, folder):
    """The experiment's own results on the folder, computed directly (the oracle of the files)."""
    from vitcli.experiments.anatomy_images import measure
    from vitcli.images import resolve_images

    paths = resolve_images([str(folder)])
    return measure(vit, (vit.prepare(path) for path in paths), ["distance", "cka", "pca", "norms"], norm_factor=1.5)


def _no_loading(monkeypatch) -> None:
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))


def test_without_images_the_weights_views_are_written_with_the_computations_numbers(cli, vit, workdir):
    from vitcli.experiments.anatomy_weights import filters, positions

    result = cli("anatomy", *RANDOM_CPU)
    assert result.exit_code == 0, result.stderr
    written = sorted(path.name for path in (workdir / "outputs").glob("*/*/anatomy-*"))
    assert {name.split(".")[0] for name in written} == {"anatomy-filters", "anatomy-positions"}
    expected = filters(vit)
    files = result_files(workdir / "outputs", "anatomy-filters")
    assert set(files) >= {"json", "csv", "png"}
    body = json.loads(files["json"].read_text())["result"]
    np.testing.assert_allclose(body["explained_variance_ratio"], expected.explained_variance_ratio, rtol=1e-12)
    np.testing.assert_allclose(body["components"], expected.components, rtol=1e-12)
    frame = pandas.read_csv(files["csv"])
    assert list(frame["component"]) == list(range(1, 29))
    np.testing.assert_allclose(frame["singular_value"], expected.singular_values, rtol=1e-12)
    similarity = positions(vit).similarity
    files = result_files(workdir / "outputs", "anatomy-positions")
    np.testing.assert_allclose(np.loadtxt(files["similarity.csv"], delimiter=","), similarity, rtol=1e-12)
    np.testing.assert_allclose(json.loads(files["json"].read_text())["result"]["similarity"], similarity, rtol=1e-12)
    assert files["png"].stat().st_size > 0


def test_every_image_view_over_a_folder_holds_the_computations_numbers(cli, folder, measured, workdir):
    views = ["--view", "distance", "--view", "cka", "--view", "pca", "--view", "norms"]
    result = cli("anatomy", folder, *RANDOM_CPU, *views, "--norm-factor", "1.5")
    assert result.exit_code == 0, result.stderr
    outputs = workdir / "outputs"
    distance = result_files(outputs, "anatomy-distance")
    body = json.loads(distance["json"].read_text())["result"]
    np.testing.assert_allclose(body["mean"], measured.distance.mean, rtol=1e-9)
    frame = pandas.read_csv(distance["csv"])
    assert len(frame) == measured.distance.mean.size
    np.testing.assert_allclose(frame["mean_distance_pixels"], measured.distance.mean.ravel(), rtol=1e-9)
    cka = result_files(outputs, "anatomy-cka-mb32")
    np.testing.assert_allclose(np.loadtxt(cka["matrix.csv"], delimiter=","), measured.cka.matrix, rtol=1e-9)
    np.testing.assert_allclose(pandas.read_csv(cka["csv"])["cka"], measured.cka.matrix.ravel(), rtol=1e-9)
    pca = result_files(outputs, "anatomy-pca-t0.5")
    np.testing.assert_allclose(np.load(pca["rgb.npy"]), measured.pca.rgb, atol=1e-6)
    np.testing.assert_array_equal(np.load(pca["mask.npy"]), measured.pca.mask)
    norms = result_files(outputs, "anatomy-norms-f1.5")
    listed = json.loads(norms["json"].read_text())["result"]
    np.testing.assert_allclose(listed["medians"], measured.norms.medians, rtol=1e-6)
    found = [(row["token_index"], row["block"]) for row in listed["outliers"]]
    assert found == [(outlier.token, outlier.block) for outlier in measured.norms.outliers]
    assert len(pandas.read_csv(norms["csv"])) == len(measured.norms.outliers) > 0
    for files in (distance, cka, pca, norms):
        assert files["png"].stat().st_size > 0
    assert "mean attention distance in pixels over 4" in " ".join(result.stdout.split())


@pytest.mark.parametrize(
    ("arguments", "fragments"),
    [
        (["--view", "cka", str(EXAMPLES / "newfoundland_31.jpg")], ["--view cka needs at least 4 images", "got 1"]),
        (["--view", "distance", "--view", "norms"], ["--view distance, norms need images"]),
        (["--view", "pca"], ["--view pca needs images"]),
        (["--norm-factor", "0"], ["--norm-factor must be a positive number", "not 0.0"]),
        (["--view", "cka", "--cka-minibatch", "2", str(EXAMPLES)], ["--cka-minibatch must be between 4 and 4096"]),
    ],
)
def test_bad_input_is_refused_in_one_line_before_the_model_loads(cli, monkeypatch, arguments, fragments):
    _no_loading(monkeypatch)
    result = cli("anatomy", *RANDOM_CPU, *arguments)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_swin_is_refused_in_one_line(cli, monkeypatch):
    _no_loading(monkeypatch)
    result = cli("anatomy", *RANDOM_CPU, "--model", "swin_tiny_patch4_window7_224", "--view", "distance", EXAMPLES)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "lacks: no single token grid through every block" in lines[0]


def test_a_run_config_with_anatomy_writes_its_views_and_the_report_shows_them(cli, folder, measured, workdir):
    hostile = workdir / "images"
    shutil.copytree(folder, hostile)
    (hostile / "noise0.png").rename(hostile / "<b>x<b>.png")
    config = workdir / "anatomy.toml"
    config.write_text(
        f'name = "anat"\nimages = ["{hostile}"]\n[model]\nweights = "random"\ndevice = "cpu"\n'
        '[[experiments]]\ncommand = "anatomy"\nview = ["filters", "cka", "pca"]\n',
        encoding="utf-8",
    )
    result = cli("run", config)
    assert result.exit_code == 0, result.stderr
    run = workdir / "outputs" / "anat"
    manifest = json.loads((run / "manifest.json").read_text())
    names = {entry["experiment"] for entry in manifest["results"]}
    assert {"anatomy-filters", "anatomy-cka-mb32", "anatomy-pca-t0.5"} <= names
    (cka,) = (run / MODEL_FOLDER).glob("set-*/anatomy-cka-mb32.matrix.csv")
    # the same images (one renamed) in the same order give the same CKA as the direct computation
    np.testing.assert_allclose(np.loadtxt(cka, delimiter=","), measured.cka.matrix, rtol=1e-9)
    report = cli("report", run)
    assert report.exit_code == 0, report.stderr
    page = (run / "report.html").read_text(encoding="utf-8")
    for name in ("anatomy-filters", "anatomy-cka-mb32", "anatomy-pca-t0.5"):
        assert f"<h3>{name}</h3>" in page
    assert page.count("data:image/png;base64,") >= 3
    assert "<b>x<b>" not in page and "&lt;b&gt;x&lt;b&gt;" in page


def test_a_run_config_with_cka_on_too_few_images_is_refused_with_its_key(cli, monkeypatch, workdir):
    _no_loading(monkeypatch)
    config = workdir / "anatomy.toml"
    config.write_text(
        f'images = ["{EXAMPLES}"]\n[model]\nweights = "random"\n[[experiments]]\ncommand = "anatomy"\nview = "cka"\n',
        encoding="utf-8",
    )
    result = cli("run", config)
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: experiments[0].view: --view cka needs at least 4 images (CKA compares blocks across images; its "
        "unbiased estimator needs 4), got 2"
    )


def test_the_api_returns_a_result_per_view_with_dataframes(vit, folder, measured):
    import vitcli

    one = vitcli.anatomy(vit, folder, view="distance")
    frame = one.to_frame()
    assert list(frame[["block", "head"]].iloc[0]) == [1, 1]
    np.testing.assert_allclose(frame["mean_distance_pixels"], measured.distance.mean.ravel(), rtol=1e-9)
    every = vitcli.anatomy(vit, folder, view=["positions", "cka"])
    assert set(every) == {"positions", "cka"}
    np.testing.assert_allclose(every["cka"].to_frame()["cka"], measured.cka.matrix.ravel(), rtol=1e-9)
    assert every["positions"].to_dict()["experiment"]["name"] == "anatomy-positions"
    assert set(vitcli.anatomy(vit)) == {"filters", "positions"}
    with pytest.raises(vitcli.errors.UsageError, match="--view cka needs at least 4 images"):
        vitcli.anatomy(vit, EXAMPLES / "Persian_98.jpg", view="cka")


def test_the_commands_defaults_are_the_computations(vit):
    from vitcli.experiments import anatomy_images as experiment
    from vitcli.jobs import anatomy as command

    assert command.DEFAULT_NORM_FACTOR == experiment.DEFAULT_NORM_FACTOR
    assert command.DEFAULT_PCA_THRESHOLD == experiment.DEFAULT_PCA_THRESHOLD
    assert command.DEFAULT_CKA_MINIBATCH == experiment.DEFAULT_CKA_MINIBATCH
    assert command.MIN_CKA_IMAGES == experiment.CKA_MIN_IMAGES


def test_an_unreadable_image_is_left_out_of_the_set_and_named(cli, folder, measured, workdir):
    """The set's numbers are those of the readable images (the direct computation over them), and every view's JSON
    and table name the file left out."""
    images = workdir / "images"
    shutil.copytree(folder, images)
    (images / "broken.jpg").write_text("not an image")
    result = cli("anatomy", images, *RANDOM_CPU, "--view", "cka", "--view", "distance", "-o", "out")
    assert result.exit_code == 0, result.stderr
    assert "left out 1 image that cannot be read" in result.stdout and "broken.jpg" in result.stdout
    (cka,) = (workdir / "out" / MODEL_FOLDER).glob("set-*/anatomy-cka-mb32.json")
    document = json.loads(cka.read_text())
    (skipped,) = document["result"]["skipped_images"]
    assert "broken.jpg" in skipped and "is not an image" in skipped
    assert document["result"]["images"] == 4
    np.testing.assert_allclose(document["result"]["matrix"], measured.cka.matrix, rtol=1e-9)


def test_a_sharded_run_refuses_views_about_the_images_together(cli, monkeypatch, folder, workdir):
    _no_loading(monkeypatch)
    config = workdir / "anatomy.toml"
    config.write_text(
        f'images = ["{folder}"]\n[model]\nweights = "random"\n[[experiments]]\ncommand = "anatomy"\nview = "cka"\n',
        encoding="utf-8",
    )
    result = cli("run", config, "--shard", "1/2")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert "--shard 1/2: experiments[0] (anatomy) is about the run's images together" in result.stderr
    assert "and needs them all in one process" in result.stderr
