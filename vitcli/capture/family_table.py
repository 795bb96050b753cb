"""docs/models.md's family x command table, generated from capture.support.COMMAND_NEEDS and one representative
model of each family (FAMILIES): `python -m vitcli.capture.family_table [--check] docs/models.md`
(`make docs`, `make docs-check`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from vitcli.capture.families import family_of
from vitcli.capture.support import COMMAND_NEEDS, family_features, missing_features

BEGIN_MARK = "<!-- BEGIN family-table -->"
END_MARK = "<!-- END family-table -->"


@dataclass(frozen=True)
class Example:
    """One column of docs/models.md's family table: a family adapter (by class name, so that listing it imports no
    optional library), a model of that family or form, and how to build that model's meta skeleton."""

    label: str  # how the table names the family or form
    adapter: str  # the Family subclass family_of gives for the model
    model: str  # what --model takes
    build: Callable[[], nn.Module]


def timm_skeleton(name: str) -> Callable[[], nn.Module]:
    """Builds timm's model `name` on the meta device: shapes only, no weights."""

    def build() -> nn.Module:
        import timm

        return timm.create_model(name, pretrained=False, device="meta")

    return build


def hf_skeleton(class_name: str, config_name: str) -> Callable[[], nn.Module]:
    """Builds transformers' `class_name` from its config class's defaults on the meta device, wrapped as
    `--model hf:FOLDER` wraps it."""

    def build() -> nn.Module:
        import torch
        import transformers

        from vitcli.capture.families.hf import HFTower, default_data_config

        config = getattr(transformers, config_name)()
        with torch.device("meta"):
            model = getattr(transformers, class_name)._from_config(config, attn_implementation="eager")
        return HFTower(model, default_data_config(config))

    return build


def open_clip_skeleton(name: str) -> Callable[[], nn.Module]:
    """Builds open_clip's image tower `name` on the meta device, as `--model open_clip:NAME` does."""

    def build() -> nn.Module:
        from vitcli.loading_towers import tower_skeleton

        return tower_skeleton(f"open_clip:{name}")

    return build


# One representative per family, and per form of a family where commands answer differently; adding a family adds a
# column to docs/models.md (`make docs`).
FAMILIES = [
    Example("timm ViT, CLS", "TimmViT", "vit_tiny_patch16_224", timm_skeleton("vit_tiny_patch16_224")),
    Example(
        "timm ViT, CLS and DIST (DeiT)",
        "TimmViT",
        "deit_tiny_distilled_patch16_224",
        timm_skeleton("deit_tiny_distilled_patch16_224"),
    ),
    Example(
        "timm ViT, CLS and registers (DINOv2)",
        "TimmViT",
        "vit_small_patch14_reg4_dinov2",
        timm_skeleton("vit_small_patch14_reg4_dinov2"),
    ),
    Example(
        "timm ViT, no CLS, mean pooling",
        "TimmViT",
        "vit_medium_patch16_gap_256",
        timm_skeleton("vit_medium_patch16_gap_256"),
    ),
    Example(
        "timm ViT, no CLS, attention pooling (SigLIP)",
        "TimmViT",
        "vit_base_patch16_siglip_224",
        timm_skeleton("vit_base_patch16_siglip_224"),
    ),
    Example("timm Eva (EVA-02)", "TimmEva", "eva02_tiny_patch14_224", timm_skeleton("eva02_tiny_patch14_224")),
    Example("timm Beit", "TimmBeit", "beit_base_patch16_224", timm_skeleton("beit_base_patch16_224")),
    Example("timm Swin", "TimmSwin", "swin_tiny_patch4_window7_224", timm_skeleton("swin_tiny_patch4_window7_224")),
    Example(
        "HF ViTForImageClassification",
        "HFFamily",
        "hf:FOLDER",
        hf_skeleton("ViTForImageClassification", "ViTConfig"),
    ),
    Example("HF Dinov2Model", "HFFamily", "hf:FOLDER", hf_skeleton("Dinov2Model", "Dinov2Config")),
    Example("HF CLIPVisionModel", "HFFamily", "hf:FOLDER", hf_skeleton("CLIPVisionModel", "CLIPVisionConfig")),
    Example("open_clip tower", "OpenClipFamily", "open_clip:ViT-B-32", open_clip_skeleton("ViT-B-32")),
]


def family_table() -> str:
    """The Markdown between docs/models.md's markers: which command runs on which family (from COMMAND_NEEDS and
    each family's representative in FAMILIES), what each feature means, and each family's tokens."""
    from vitcli.capture.family import FEATURES

    columns = []
    for example in FAMILIES:
        family = family_of(example.build())
        if type(family).__name__ != example.adapter:
            raise ValueError(f"{example.model} is wrapped by {type(family).__name__}, not {example.adapter}")
        columns.append((example, family))
    header = ["command", *(f"{example.label}<br>`{example.model}`" for example, _ in columns)]
    lines = [
        "Generated from `COMMAND_NEEDS` in `vitcli/capture/support.py` and the family adapters by `make docs`; "
        "`make docs-check` and the tests fail when this part and the code disagree. **yes**: runs; "
        "**with a target**: needs --target-image, --target-direction or --target-feature (no classifier head), or "
        "on a model with a text tower --target-text or zero-shot --labels; "
        "**no**: refused in one line (exit 2) before the weights load, naming what the family lacks.",
        "",
        "| " + " | ".join(header) + " |",
        "| " + " | ".join("---" for _ in header) + " |",
    ]
    for command in COMMAND_NEEDS:
        cells = [_cell(command, family_features(family)) for _, family in columns]
        lines.append(f"| `{command}` | " + " | ".join(cells) + " |")
    lines += ["", "| feature | what it means | needed by |", "| --- | --- | --- |"]
    for feature, meaning in FEATURES.items():
        users = [f"`{command}`" for command, needs in COMMAND_NEEDS.items() if feature in needs]
        lines.append(f"| `{feature}` | {meaning} | {', '.join(users) or 'none yet'} |")
    lines += [
        "",
        "Token names: the prefix tokens first (CLS, then DIST or R1..Rn), then the patches P1..PN row by row, "
        "whatever the grid; `--query 74` always means P74.",
        "",
        "| family | model | grid | tokens | pooling | classes |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for example, family in columns:
        grid = family.grid()
        tokens = grid.token_names()
        facts = [example.label, f"`{example.model}`", f"{grid.rows}x{grid.cols}", tokens, family.pooling]
        lines.append("| " + " | ".join([*facts, str(family.num_classes)]) + " |")
    return "\n".join(lines)


def _cell(command: str, features: frozenset[str]) -> str:
    missing = missing_features(command, features)
    if not missing:
        return "yes"
    if not missing_features(command, features, has_embedding_target=True):
        return "with a target"
    return "no: " + ", ".join(f"`{feature}`" for feature in missing)


def page_with_table(page: str) -> str:
    """`page` with the text between the family-table markers replaced by family_table()."""
    start, end = page.find(BEGIN_MARK), page.find(END_MARK)
    if start < 0 or end < start:
        raise ValueError(f"the page has no {BEGIN_MARK} ... {END_MARK} markers")
    return page[: start + len(BEGIN_MARK)] + "\n" + family_table() + "\n" + page[end:]


def main(arguments: list[str]) -> int:
    """`python -m vitcli.capture.family_table [--check] docs/models.md`: write the table, or with --check say whether
    the page holds the table the code gives (exit 1 when it does not)."""
    from pathlib import Path

    check = "--check" in arguments
    paths = [argument for argument in arguments if argument != "--check"]
    path = Path(paths[0] if paths else "docs/models.md")
    page = path.read_text(encoding="utf-8")
    expected = page_with_table(page)
    if check:
        if expected != page:
            print(f"{path}'s family table is stale: run 'make docs' and commit it", file=sys.stderr)
            return 1
        return 0
    path.write_text(expected, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
