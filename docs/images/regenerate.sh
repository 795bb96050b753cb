#!/usr/bin/env bash
# Regenerate the figures the README and docs/commands show, from the repository root, with random weights (no
# network). Each PNG is the one vitcli wrote, resized to the width the pages show it at (Lanczos) and saved as
# full-colour RGB: no palette, so colour bars do not band.
set -euo pipefail
VITCLI=${VITCLI:-vitcli}
PYTHON=${PYTHON:-python}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
dog=examples/images/newfoundland_31.jpg
common=(--weights random --device cpu -o "$out" -q)
$VITCLI patches $dog --patch 63 "${common[@]}"
$VITCLI attend $dog --block 4 --all-heads --query 74 "${common[@]}"
$VITCLI occlude-patches $dog --target 256 "${common[@]}"
$VITCLI compare-patch-size -o "$out" -q
$VITCLI lens $dog "${common[@]}"
$VITCLI explain $dog --method gradcam --method rollout --method occlusion --faithfulness --steps 14 \
    --random-orders 3 "${common[@]}"
$PYTHON - "$out" <<'PY'
import sys
from pathlib import Path

from PIL import Image

out = Path(sys.argv[1])
shown = {  # docs/images name: (result name prefix, width in pixels)
    "patches": ("patches-p63", 540),
    "attend": ("attention-b4-hall-q74", 900),
    "occlude-patches": ("occlusion-patches", 800),
    "compare-patch-size": ("patch-sizes", 900),
    "lens": ("lens", 900),
    "explain": ("explain-", 900),
}
for name, (prefix, width) in shown.items():
    (source,) = [path for path in out.rglob("*.png") if path.name.startswith(prefix)]
    with Image.open(source) as image:
        image = image.convert("RGB")
        height = round(image.height * width / image.width)
        image.resize((width, height), Image.Resampling.LANCZOS).save(f"docs/images/{name}.png", optimize=True)
    print(f"docs/images/{name}.png from {source.name}")
PY
