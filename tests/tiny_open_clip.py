"""Tiny open_clip image-text models for fast tests, registered with open_clip under names of their own.

`vitcli-tiny-clip`: a CLIP (open_clip's VisionTransformer, 2 blocks of width 64 on 64x64 inputs, and a 2-block text
transformer); `vitcli-tiny-sigmoid`: a SigLIP-like pair (a timm ViT-Tiny trunk on 224x224 inputs pooled by attention,
no projection, with a text tower, a logit bias and no causal mask). Both use CLIP's bundled tokenizer: nothing is
fetched. `register()` writes their configs to a temporary folder and adds it to open_clip's registry (once per process).
"""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

TINY_CLIP = "vitcli-tiny-clip"
TINY_SIGMOID = "vitcli-tiny-sigmoid"
TINY_PROJECTED = "vitcli-tiny-timm-projected"  # a timm trunk whose pooled output open_clip projects again
CONTEXT = 16

_TEXT = {"context_length": CONTEXT, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2}
CONFIGS = {
    TINY_CLIP: {
        "embed_dim": 32,
        "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "head_width": 32, "patch_size": 16},
        "text_cfg": _TEXT,
    },
    TINY_SIGMOID: {
        "embed_dim": 192,
        "init_logit_bias": -10,
        "custom_text": True,
        "vision_cfg": {
            "image_size": 224,  # the trunk's own: open_clip builds it at its name's size
            "timm_model_name": "vit_tiny_patch16_224",
            "timm_model_pretrained": False,
            "timm_pool": "map",
            "timm_proj": "none",
        },
        "text_cfg": {**_TEXT, "no_causal_mask": True, "proj_bias": True, "pool_type": "last"},
    },
}
CONFIGS[TINY_PROJECTED] = {
    **CONFIGS[TINY_SIGMOID],
    "embed_dim": 32,
    "vision_cfg": {**CONFIGS[TINY_SIGMOID]["vision_cfg"], "timm_pool": "avg", "timm_proj": "linear"},
}


@functools.cache
def register() -> Path:
    import open_clip

    folder = Path(tempfile.mkdtemp(prefix="vitcli-open-clip-configs-"))
    for name, config in CONFIGS.items():
        (folder / f"{name}.json").write_text(json.dumps(config), encoding="utf-8")
    open_clip.add_model_config(folder)
    return folder
