#!/usr/bin/env bash
# The lecture's experiments on one photograph, in the order the lecture tells them.
# Usage: bash configs/lecture.sh [IMAGE] [vitcli options...]
#   e.g. bash configs/lecture.sh ../shared/data/newfoundland_31.jpg --weights random -q
# Each step writes its files under outputs/COMMAND/IMAGE-STEM; options after IMAGE go to every step.
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
step attend "${image[@]}" --summary --query 74 "$@"
step occlude-quadrants "${image[@]}" "$@"
step occlude-patches "${image[@]}" "$@"
step compare-patch-size "$@"
