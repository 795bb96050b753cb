"""Every command on an open_clip image tower (random ViT-S-32, headless: an embedding target where a command takes
one) and on timm's attention-pooled ViT (`test_vit3`, SigLIP's form with a classifier head) runs, or is refused in
one line, exit 2, before loading, as docs/models.md's table says (capture.support)."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from tests.conftest import RANDOM_CPU
from vitcli.capture.support import TARGET_COMMANDS, missing_features
from vitcli.spec import WeightsSpec

MODELS = ["open_clip:ViT-S-32", "test_vit3"]

# (COMMAND_NEEDS key, arguments after the command's name); {image}, {other} and {folder} are filled in.
PAIRS = [
    ("predict", ["predict", "{image}"]),
    ("patches", ["patches", "{image}"]),
    ("attend", ["attend", "{image}", "--block", "1", "--head", "1", "--query", "1"]),
    ("attend --view summary", ["attend", "{image}", "--view", "summary", "--query", "1"]),
    ("attend --view all-blocks", ["attend", "{image}", "--view", "all-blocks", "--head", "1", "--query", "1"]),
    ("attend --view rollout", ["attend", "{image}", "--view", "rollout", "--query", "1"]),
    ("attend --pool", ["attend", "{image}", "--pool"]),
    ("occlude-quadrants", ["occlude-quadrants", "{image}"]),
    ("occlude-patches", ["occlude-patches", "{image}"]),
    ("trace", ["trace", "{image}", "--token", "1"]),
    ("compare", ["compare", "{image}", "{other}"]),
    ("explain", ["explain", "{image}", "--method", "gradient", "--method", "gradcam", "--method", "occlusion"]),
    ("explain", ["explain", "{image}", "--method", "gradient", "--faithfulness", "--random-orders", "2"]),
    ("explain --method attention", ["explain", "{image}", "--method", "attention"]),
    ("explain --method rollout", ["explain", "{image}", "--method", "rollout"]),
    ("explain --method relevance", ["explain", "{image}", "--method", "relevance"]),
    ("explain --method grad-rollout", ["explain", "{image}", "--method", "grad-rollout"]),
    ("explain --method dla", ["explain", "{image}", "--method", "dla"]),
    ("lens", ["lens", "{image}"]),
    ("attribute", ["attribute", "{image}", "--by", "block"]),
    ("attribute --by head", ["attribute", "{image}", "--by", "head"]),
    ("attribute --by token", ["attribute", "{image}", "--by", "token", "--block", "1"]),
    ("ablate", ["ablate", "{image}"]),
    ("patch", ["patch", "{image}", "{other}", "--sites", "attention"]),  # one forward per block, not per row
    ("compare-patch-size", ["compare-patch-size"]),
    ("compare-patch-size --adapt", ["compare-patch-size", "--adapt", "{image}"]),
    ("probe", ["probe", "{folder}"]),
    ("explore", ["explore", "{image}"]),
    ("heads", ["heads", "{folder}/dark", "--texts", "{folder}/bank.txt", "--k", "2"]),
    *[
        (f"anatomy --view {view}", ["anatomy", "{folder}/dark" if view == "cka" else "{image}", "--view", view])
        for view in ("filters", "positions", "distance", "cka", "pca", "norms")
    ],
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """An ImageFolder of two classes, four small images each, for probe (and the four images CKA and heads need), and
    a text bank for heads."""
    root = tmp_path_factory.mktemp("probe")
    for name, colour in (("dark", (40, 60, 80)), ("light", (220, 200, 180))):
        (root / name).mkdir()
        for index in range(4):
            Image.new("RGB", (64, 48), tuple(value + 10 * index for value in colour)).save(root / name / f"{index}.jpg")
    (root / "bank.txt").write_text("a dog\na cat\na red car\n", encoding="utf-8")  # heads' texts (probe reads folders)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(("key", "arguments"), PAIRS, ids=lambda value: value if isinstance(value, str) else None)
def test_every_pair_runs_or_is_refused_as_the_table_says(cli, photo, newfoundland, folder, model, key, arguments):
    from vitcli.loading import describe

    features = describe(WeightsSpec(model_name=model, random=True)).features
    command = key.split(" ", 1)[0]
    target = command in TARGET_COMMANDS and "class_head" not in features  # headless: follow embedding feature 0
    missing = missing_features(key, features, has_embedding_target=target)
    filled = [argument.format(image=photo, other=newfoundland, folder=folder) for argument in arguments]
    options = ["--target-feature", "0"] if target else []
    result = cli(*filled, *options, "--model", model, "--no-figures", *RANDOM_CPU)
    if missing:
        assert result.exit_code == 2, result.stderr
        assert result.stderr.count("\n") == 1 and f"`{key}` needs what {model}" in result.stderr, result.stderr
    else:
        assert result.exit_code == 0, result.stderr
