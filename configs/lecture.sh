#!/usr/bin/env bash
# The lecture's experiments on one photograph as separate commands, in the order the lecture tells them:
# the same experiments as configs/lecture.toml, which runs them in one process (faster; see benchmarks/run.py).
# Usage: bash configs/lecture.sh [IMAGE] [vitcli options...]
#   e.g. bash configs/lecture.sh examples/images/newfoundland_31.jpg --weights random -q
# Each step writes its files under outputs/MODEL/IMAGE-HASH/; options after IMAGE go to every step.
set -euo pipefail

vitcli=${VITCLI:-vitcli}
image=()
if [[ $# -gt 0 && $1 != -* ]]; then
    image=("$1")
    shift
fi

step() { printf '\n== vitcli %s\n' "$*" >&2; "$vitcli" "$@"; }

step predict "${image[@]}" "$@"
step patches "${image[@]}" --patch 63 "$@"
step attend "${image[@]}" --block 4 --head 1 --query 74 "$@"
step attend "${image[@]}" --view summary --query 74 "$@"
step occlude-quadrants "${image[@]}" --target 256 "$@"
step occlude-patches "${image[@]}" --target 256 --size 16 --stride 16 "$@"
step compare-patch-size --patch-sizes 8,16,32 "$@"
