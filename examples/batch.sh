#!/usr/bin/env bash
# Run a config's experiments over a folder of images, then collect the results.
#
# Usage (from anywhere):  bash examples/batch.sh [FOLDER] [vitcli options...]
#   bash examples/batch.sh                                      # examples/images, the pretrained checkpoint
#   bash examples/batch.sh ~/photos --weights random            # no network: an untrained model
#   bash examples/batch.sh --weights random                     # options alone: examples/images
#   CONFIG=configs/lecture.toml NAME=lecture OUT=/tmp/vitcli bash examples/batch.sh ~/photos
#
# The run is resumable: run the script again after an interruption and finished results are skipped.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
folder=$root/examples/images
if [[ $# -gt 0 && $1 != -* ]]; then         # FOLDER comes first; the rest are vitcli options (--weights random, ...)
    folder=$1
    shift
fi
config=${CONFIG:-$root/configs/sweep.toml}  # which experiments
name=${NAME:-sweep}                         # the config's `name`: the run's folder under $out
out=${OUT:-outputs}                         # the output folder
vitcli=${VITCLI:-vitcli}                    # or .venv/bin/vitcli without an activated environment
run="$out/$name"

# 1. Every experiment of the config on every image, one process, one model load. Exit status 1 with a manifest
#    written by this run means some images failed: they are listed in it, the others are done, so go on collecting.
#    Any other failure (exit 2: a usage error, nothing ran) has said why in one line: stop with its status.
started=$(mktemp)
trap 'rm -f "$started"' EXIT
status=0
"$vitcli" run "$config" "$folder" -o "$out" "$@" || status=$?
if [[ $status -eq 1 && $run/manifest.json -nt $started ]]; then
    echo "some images failed: see $run/manifest.json; collecting the others" >&2
elif [[ $status -ne 0 ]]; then
    echo "vitcli run exited $status (see above); nothing to collect" >&2
    exit "$status"
fi

# 2. One HTML page with every figure, the summary table and the failures.
"$vitcli" report "$run"

# 3. The numbers: summary.csv has one row per image; the manifest says what failed and how long each step took.
echo "summary: $run/summary.csv ($(($(wc -l < "$run/summary.csv") - 1)) images)"
if command -v jq > /dev/null; then
    jq -r '.failures[] | "failed: \(.image) \(.experiment // "") \(.error)"' "$run/manifest.json"
    jq -r '.timings | to_entries[] | "\(.key): \(.value.results) results, \(.value.compute_seconds) s"' \
        "$run/manifest.json"

    # 4. Streams for scripts: one JSON document per image as soon as it is ready, here reduced to a TSV of top-1s
    #    (the images that failed above fail here again).
    "$vitcli" predict "$folder" -o "$out" -f jsonl -q "$@" \
        | jq -r '[.subject.path, .result.top[0].class_index, .result.top[0].label, .result.top[0].probability] | @tsv' \
        > "$run/top1.tsv" || [[ $status -eq 1 ]]
    echo "top-1 per image: $run/top1.tsv"
fi
exit "$status"                              # 1 when some images failed, so that callers know
