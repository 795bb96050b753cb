"""The shapes model: a small ViT trained here on generated scenes (vitcli.scenes), shipped with vitcli.

`vit_shapes_patch16_224` is registered with timm by `register()` (vitcli.loading calls it on import): a
VisionTransformer with a class token, 224x224 input, 16-px patches (a 14x14 grid), EMBED_DIM wide, DEPTH blocks of
HEADS heads, and a head over the six classes of vitcli.scenes.CLASS_NAMES. Its weights ship as package data
(vitcli/models/shapes.safetensors, fp16, with shapes.labels.txt beside it and the training record shapes.json);
`--model shapes` (or the architecture's name without --checkpoint) loads them, and `make shapes-model` retrains
them (vitcli.shapes_training). Preprocessing is the identity on a 224x224 scene: crop_pct 1, mean and std 0.5.
"""

from __future__ import annotations

from pathlib import Path

ALIAS = "shapes"
ARCHITECTURE = "vit_shapes_patch16_224"
MODELS = Path(__file__).resolve().parent / "models"
CHECKPOINT = MODELS / "shapes.safetensors"
LABELS = MODELS / "shapes.labels.txt"
RECORD = MODELS / "shapes.json"
EMBED_DIM = 96
DEPTH = 4
HEADS = 3
MLP_RATIO = 2.0
NUM_CLASSES = 6
MEAN = STD = (0.5, 0.5, 0.5)


def resolve(model_name: str, random: bool, checkpoint: Path | None) -> tuple[str, Path | None]:
    """--model shapes names the architecture; it and the architecture's own name take the shipped checkpoint unless
    --checkpoint or --weights random says otherwise. Other models pass through."""
    if model_name not in (ALIAS, ARCHITECTURE):
        return model_name, checkpoint
    return ARCHITECTURE, checkpoint if random or checkpoint is not None else CHECKPOINT


def register() -> None:
    """Register the architecture with timm (once per process)."""
    from timm.models import _registry

    if ARCHITECTURE in _registry._model_entrypoints:
        return
    _register()


def _register() -> None:
    import sys

    from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
    from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn

    module = sys.modules[__name__]
    module.default_cfgs = generate_default_cfgs(  # timm's register_model reads the module's default_cfgs
        {
            f"{ARCHITECTURE}.vitcli": {
                "file": str(CHECKPOINT),
                "num_classes": NUM_CLASSES,
                "input_size": (3, 224, 224),
                "crop_pct": 1.0,
                "interpolation": "bicubic",
                "mean": MEAN,
                "std": STD,
                "first_conv": "patch_embed.proj",
                "classifier": "head",
                "license": "same as vitcli",
            }
        }
    )

    def vit_shapes_patch16_224(pretrained: bool = False, **kwargs):
        settings = dict(patch_size=16, embed_dim=EMBED_DIM, depth=DEPTH, num_heads=HEADS, mlp_ratio=MLP_RATIO)
        return build_model_with_cfg(
            VisionTransformer,
            ARCHITECTURE,
            pretrained,
            pretrained_filter_fn=checkpoint_filter_fn,
            **{**settings, "num_classes": NUM_CLASSES, **kwargs},
        )

    vit_shapes_patch16_224.__module__ = __name__
    register_model(vit_shapes_patch16_224)
