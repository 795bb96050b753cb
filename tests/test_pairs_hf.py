"""Every command on every Hugging Face class vitcli reads (`--model hf:FOLDER`): it runs (exit 0) where docs/models.md's
table says yes, with `--target-feature 0` where it says "with a target", and is refused in one line (exit 2) naming
what the family lacks where it says no. Tiny random models: 64 wide, 2 blocks of 2 heads, a 10x10 grid of 8-pixel
patches (P74 exists; the quadrants split it evenly)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from vitcli.capture.support import missing_features  # noqa: E402

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=80, patch_size=8)
LABELS = {0: "cat", 1: "dog", 2: "fox"}
MODELS = {
    "ViTForImageClassification": lambda: transformers.ViTConfig(
        intermediate_size=128, num_labels=3, id2label=LABELS, label2id={v: k for k, v in LABELS.items()}, **TINY
    ),
    "ViTModel": lambda: transformers.ViTConfig(intermediate_size=128, **TINY),
    "Dinov2Model": lambda: transformers.Dinov2Config(**TINY),
    "CLIPVisionModel": lambda: transformers.CLIPVisionConfig(intermediate_size=128, **TINY),
}
RANDOM = ("--weights", "random", "--seed", "0", "--device", "cpu")

# (the COMMAND_NEEDS key, the arguments after the command; {image}, {other}, {folder}, {four} are filled in)
COMMANDS = [
    ("predict", ["predict", "{image}"]),
    ("patches", ["patches", "{image}", "--patch", "74"]),
    ("attend", ["attend", "{image}", "--block", "2", "--head", "1", "--query", "74"]),
    ("attend --view summary", ["attend", "{image}", "--view", "summary", "--query", "all"]),
    ("attend --view all-blocks", ["attend", "{image}", "--view", "all-blocks", "--head", "1", "--query", "74"]),
    ("attend --view rollout", ["attend", "{image}", "--view", "rollout"]),
    ("occlude-quadrants", ["occlude-quadrants", "{image}"]),
    ("occlude-patches", ["occlude-patches", "{image}"]),
    ("trace", ["trace", "{image}", "--token", "0,74"]),
    ("compare", ["compare", "{image}", "{other}"]),
    *(
        ("explain", ["explain", "{image}", "--method", method])
        for method in ("gradient", "ig", "smoothgrad", "gradcam", "occlusion")
    ),
    ("explain", ["explain", "{image}", "--method", "gradcam", "--faithfulness"]),
    *(
        (f"explain --method {method}", ["explain", "{image}", "--method", method])
        for method in ("attention", "rollout", "relevance", "grad-rollout", "dla")
    ),
    ("lens", ["lens", "{image}"]),
    ("attribute", ["attribute", "{image}", "--by", "block"]),
    ("attribute --by head", ["attribute", "{image}", "--by", "head"]),
    ("attribute --by token", ["attribute", "{image}", "--by", "token", "--block", "2"]),
    ("ablate", ["ablate", "{image}"]),
    ("patch", ["patch", "{image}", "{other}"]),
    ("compare-patch-size", ["compare-patch-size", "--patch-sizes", "8,16"]),
    ("compare-patch-size --adapt", ["compare-patch-size", "--patch-sizes", "8,16", "--adapt", "{image}"]),
    ("probe", ["probe", "{folder}"]),
    ("explore", ["explore", "{image}"]),
    ("explore --explain", ["explore", "{image}", "--explain"]),
    *(
        (f"anatomy --view {view}", ["anatomy", "{four}", "--view", view])
        for view in ("filters", "positions", "distance", "cka", "pca", "norms")
    ),
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    saved = {}
    for index, (name, config) in enumerate(MODELS.items()):
        torch.manual_seed(index)
        folder = tmp_path_factory.mktemp(name)
        getattr(transformers, name)(config()).save_pretrained(folder)
        saved[name] = folder
    return saved


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory, persian, newfoundland):
    """Two classes of two images each (probe), and four images in one folder (anatomy's CKA needs four)."""
    from PIL import Image, ImageOps

    root = tmp_path_factory.mktemp("pets")
    for name, source in (("cat", persian), ("dog", newfoundland)):
        (root / name).mkdir()
        image = Image.open(source).convert("RGB")
        image.save(root / name / f"{name}_0.jpg")
        ImageOps.mirror(image).save(root / name / f"{name}_1.jpg")
    four = root / "four"
    four.mkdir()
    for path in sorted(root.glob("*/*.jpg")):
        Image.open(path).save(four / f"{path.parent.name}_{path.name}")
    return root


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_every_command_runs_or_is_refused_as_the_table_says(cli, folders, image_folder, persian, newfoundland, name):
    """Seen to fail before: every hf: command was refused as a featureless "timm VisionTransformer", and once that was
    fixed, patches, compare, Grad-CAM, explain's attention methods, lens, attribute, probe, explore, anatomy and
    compare-patch-size stopped with an internal error (timm-only attributes)."""
    from vitcli.capture.support import facts_of
    from vitcli.loading_towers import tower_skeleton

    model = f"hf:{folders[name]}"
    features = facts_of(tower_skeleton(model)).features
    fill = {"image": persian, "other": newfoundland, "folder": image_folder, "four": image_folder / "four"}
    failures = []
    for key, arguments in COMMANDS:
        filled = [str(argument).format(**fill) for argument in arguments]
        target = missing_features(key, features) and not missing_features(key, features, has_embedding_target=True)
        extra = ["--target-feature", "0"] if target else []
        result = cli(*filled, "--model", model, *RANDOM, *extra)
        if missing_features(key, features, has_embedding_target=bool(target)):
            refused = result.exit_code == 2 and result.stderr.count("\n") == 1
            if not (refused and f"`{key}` needs what {model} (Hugging Face transformers ViT)" in result.stderr):
                failures.append(f"{' '.join(arguments)}: exit {result.exit_code} {result.stderr.strip()[-300:]}")
        elif result.exit_code != 0:
            failures.append(f"{' '.join(arguments)}: exit {result.exit_code} {result.stderr.strip()[-300:]}")
    assert not failures, "\n".join(failures)
