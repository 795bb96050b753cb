"""A model without a classifier head (timm num_classes=0, such as the DINO ViT of attention-map fame)."""

from __future__ import annotations

import json

import pytest

HEADLESS = ["--model", "vit_small_patch16_224.dino", "--weights", "random", "--device", "cpu"]


@pytest.mark.slow
def test_commands_without_classes_work_and_the_others_refuse_in_one_line(cli, photo, workdir, monkeypatch):
    patches = cli("patches", photo, *HEADLESS, "--patch", "63", "-f", "json")
    assert patches.exit_code == 0, patches.stderr
    assert json.loads(patches.stdout)["results"][0]["result"]["grid"]["patches"] == 196
    attend = cli("attend", photo, *HEADLESS, "--block", "12", "--head", "6", "--query", "cls", "-f", "json")
    assert attend.exit_code == 0, attend.stderr
    (attention_map,) = json.loads(attend.stdout)["results"][0]["result"]["maps"]
    assert sum(attention_map["attention"]) == pytest.approx(1.0, abs=1e-5)  # the whole row, CLS included

    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args: pytest.fail("the model was loaded"))
    for command in (["predict"], ["occlude-quadrants"], ["lens"], ["explain", "--method", "gradcam"]):
        refused = cli(*command, photo, *HEADLESS)
        assert refused.exit_code == 2, (command, refused.stderr)
        assert refused.stderr.count("\n") == 1
        assert "(timm VisionTransformer) lacks: no classifier head (num_classes=0)" in refused.stderr
        assert "it runs patches, attend" in refused.stderr
