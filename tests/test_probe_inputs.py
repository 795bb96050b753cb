"""What a probe reads (class folder names, links) and what its checkpoint records (the backbone and settings)."""

from __future__ import annotations

import json
import os

import pytest
from PIL import Image
from safetensors import safe_open

from vitcli.errors import UsageError
from vitcli.experiments.probe import read_image_folder

from conftest import RANDOM_CPU, result_files


def image_folder(root, names, per_class=2):
    for index, name in enumerate(names):
        (root / name).mkdir(parents=True)
        for number in range(per_class):
            Image.new("RGB", (24 + number, 24), (40 * index, 90, 200 - 40 * index)).save(root / name / f"{number}.png")
    return root


@pytest.mark.parametrize(
    ("names", "fragments"),
    [
        (["cat", "do\ng"], ("'do\\ng'", "line break or control character (U+000A)")),
        (["cat", "do\u2028g"], ("'do\\u2028g'", "line break or control character (U+2028)")),
        (["cat", "do\tg"], ("control character (U+0009)",)),
        (["cat", "   "], ("'   '", "only spaces")),
        (["cat", " cat"], ("' cat'", "starts or ends with spaces")),
        (["cat", "dog "], ("'dog '", "starts or ends with spaces")),
    ],
)
def test_class_names_the_labels_file_cannot_hold_are_refused(tmp_path, names, fragments):
    """Before the fix each of these gave a checkpoint that predict then refused or misnamed."""
    with pytest.raises(UsageError) as refused:
        read_image_folder(image_folder(tmp_path / "data", names))
    assert all(fragment in str(refused.value) for fragment in fragments), str(refused.value)


def test_a_bad_class_name_is_a_usage_error_before_the_model_loads(cli, workdir, monkeypatch):
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    result = cli("probe", image_folder(workdir / "data", ["cat", "do\ng"]), *RANDOM_CPU)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "line break or control character" in result.stderr


def test_links_to_images_and_folders_inside_a_class_are_followed_once(tmp_path):
    """docs/commands/probe.md: links are followed. Before the fix a linked folder inside a class was ignored."""
    root = image_folder(tmp_path / "data", ["cat", "dog"])
    elsewhere = image_folder(tmp_path / "more", ["dogs"], per_class=3) / "dogs"
    os.symlink(elsewhere, root / "dog" / "linked")  # a folder link: 3 more dogs
    os.symlink(root / "dog", elsewhere / "back")  # a cycle through the link: read once
    os.symlink(root / "cat" / "0.png", root / "cat" / "copy.png")  # a file link: one more cat
    data = read_image_folder(root)
    assert data.classes == ["cat", "dog"]
    counts = [data.labels.count(label) for label in (0, 1)]
    assert counts == [3, 5], data.paths


def test_a_probe_checkpoint_records_its_backbone_and_later_commands_show_the_banner(cli, vit, workdir):
    """Before the fix the checkpoint's metadata was empty and predict called it plain `checkpoint NAME`."""
    result = cli("probe", image_folder(workdir / "data", ["cat", "dog"], per_class=3), *RANDOM_CPU, "-q")
    assert result.exit_code == 0, result.stderr
    checkpoint = result_files(workdir / "outputs", "probe-vf0.2-ss0-wd0.0001-checkpoint")["safetensors"]
    with safe_open(str(checkpoint), "pt") as file:
        record = json.loads(file.metadata()["vitcli"])
    backbone = record["backbone"]
    assert backbone["model"] == vit.name and backbone["parameters_sha256"] == vit.parameter_sha256
    assert backbone["weights"]["source"] == "random" and backbone["untrained_seed"] == 0
    assert record["probe"] == {"val_fraction": 0.2, "split_seed": 0, "weight_decay": 0.0001,
                               "data": str(workdir / "data"), "classes": ["cat", "dog"], "images": 6}  # fmt: skip

    shown = cli("predict", workdir / "data" / "cat" / "0.png", "--checkpoint", checkpoint, "--device", "cpu")
    assert shown.exit_code == 0, shown.stderr
    assert "RANDOM (seed 0) backbone in checkpoint" in shown.stdout and "untrained model" in shown.stdout
    document = json.loads(result_files(workdir / "outputs", "predict-k2")["json"].read_text())
    provenance = document["provenance"]
    assert provenance["weights_label"].startswith("RANDOM (seed 0) backbone in checkpoint")
    assert provenance["weights"]["recorded"] == record and "untrained" in provenance["weights"]["note"]
