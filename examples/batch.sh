#!/usr/bin/env bash
# Run a config's experiments over a folder of images, then collect the results.
#
# Usage (from anywhere):  bash examples/batch.sh [FOLDER] [vitcli options...]
#   bash examples/batch.sh                                      # examples/images, the pretrained checkpoint
#   bash examples/batch.sh ~/photos --weights random            # no network: an untrained model
#   CONFIG=configs/lecture.toml NAME=lecture OUT=/tmp/vitcli bash examples/batch.sh ~/photos
#
# The run is resumable: run the script again after an interruption and finished results are skipped.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
folder=${1:-$root/examples/images}
shift || true                               # the rest are vitcli options (--weights random, --batch-size 32, ...)
config=${CONFIG:-$root/configs/sweep.toml}  # which experiments
name=${NAME:-sweep}                         # the config's `name`: the run's folder under $out
out=${OUT:-outputs}                         # the output folder
vitcli=${VITCLI:-vitcli}                    # or .venv/bin/vitcli without an activated environment
run="$out/$name"

# 1. Every experiment of the config on every image, one process, one model load. Exit status 1 means some images
#    failed: they are listed in the manifest, the others are done, so go on collecting.
"$vitcli" run "$config" "$folder" -o "$out" "$@" || echo "some images failed: see $run/manifest.json" >&2

# 2. One HTML page with every figure, the summary table and the failures.
"$vitcli" report "$run"

# 3. The numbers: summary.csv has one row per image; the manifest says what failed and how long each step took.
echo "summary: $run/summary.csv ($(($(wc -l < "$run/summary.csv") - 1)) images)"
if command -v jq > /dev/null; then
    jq -r '.failures[] | "failed: \(.image) \(.experiment // "") \(.error)"' "$run/manifest.json"
    jq -r '.timings | to_entries[] | "\(.key): \(.value.results) results, \(.value.compute_seconds) s"' \
        "$run/manifest.json"

    # 4. Streams for scripts: one JSON document per image as soon as it is ready, here reduced to a TSV of top-1s.
    "$vitcli" predict "$folder" -o "$out" -f jsonl -q "$@" \
        | jq -r '[.subject.path, .result.top[0].class_index, .result.top[0].label, .result.top[0].probability] | @tsv' \
        > "$run/top1.tsv"
    echo "top-1 per image: $run/top1.tsv"
fi
