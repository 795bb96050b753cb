#!/usr/bin/env bash
# configs/sweep.toml over a folder as a Slurm array job: four shards, one GPU each; when all four have ended well, a
# dependent job merges their manifests and writes the HTML report.
#
# Usage, from the repository root (after `make install`):
#   sbatch examples/slurm-array.sh PHOTOS_DIR [vitcli options...]
#   sbatch examples/slurm-array.sh ~/photos                              # four shards on GPUs
#   DEVICE=cpu sbatch --gres=none --cpus-per-task=1 --mem=2G --array=1-2 \
#       examples/slurm-array.sh ~/photos --weights random                # two shards on a CPU-only cluster
# Options after PHOTOS_DIR go to every `vitcli run`. Options before the script go to sbatch and win over the
# #SBATCH lines below (a CPU-only cluster: --gres=none and the CPUs and memory its nodes have).
# Environment (sbatch passes the submitting shell's environment to the jobs):
#   DEVICE  --device of every shard (default cuda; cpu on a cluster without GPUs)
#   CONFIG  the config (default configs/sweep.toml)   NAME  its `name`, the run's folder under OUT (default sweep)
#   OUT     the output folder, shared by all nodes (default outputs)
#   VITCLI  the vitcli program (default .venv/bin/vitcli)
# Relative paths are relative to the folder sbatch was called from. Results: OUT/NAME/ (summary.csv, manifest.json,
# report.html). Change --array alone to change the number of shards: each task takes the K-th of N shares of the
# sorted images (N = the number of tasks), so the shares never overlap.
#
#SBATCH --job-name=vitcli-sweep
#SBATCH --array=1-4
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=4
#SBATCH --mem=16G
#SBATCH --time=04:00:00
#SBATCH --output=vitcli-sweep-%A_%a.log
set -euo pipefail

usage="usage: [DEVICE=cpu] sbatch [sbatch options] examples/slurm-array.sh PHOTOS_DIR [vitcli options...]"
if [[ $# -eq 0 || $1 == -* ]]; then
    echo "$usage" >&2
    exit 2
fi
photos=$1
shift
cd "${SLURM_SUBMIT_DIR:-.}"
config=${CONFIG:-configs/sweep.toml}
out=${OUT:-outputs}
run=$out/${NAME:-sweep}
vitcli=${VITCLI:-.venv/bin/vitcli}

# Shard K of N from the task's place in the array; only a contiguous array (--array=1-4, 0-9) numbers them all.
if [[ -z ${SLURM_ARRAY_TASK_ID:-} ]]; then
    echo "not an array task: submit it with sbatch (--array=1-N, or the #SBATCH line's 1-4)" >&2
    exit 2
fi
first=$SLURM_ARRAY_TASK_MIN
count=$((SLURM_ARRAY_TASK_MAX - first + 1))
if [[ $SLURM_ARRAY_TASK_COUNT != "$count" ]]; then
    echo "--array must be a range without gaps or steps (like 1-4), not $SLURM_ARRAY_TASK_COUNT tasks from" \
        "$first to $SLURM_ARRAY_TASK_MAX" >&2
    exit 2
fi
shard=$((SLURM_ARRAY_TASK_ID - first + 1))

# The first task submits the merge-and-report job once. afterok: it runs when every shard has ended with exit 0. A
# shard that fails (exit 1: some images failed, listed in its shard manifest; or a time-out) cancels it:
# read that shard's log, then resubmit the array (finished results are skipped) or merge and report by hand.
if [[ $SLURM_ARRAY_TASK_ID == "$first" ]]; then
    if ! sbatch --dependency="afterok:${SLURM_ARRAY_JOB_ID}" --kill-on-invalid-dep=yes \
        --job-name=vitcli-sweep-merge --time=00:30:00 --output=vitcli-sweep-merge-%j.log \
        --wrap="$(printf '%q merge %q && %q report %q' "$vitcli" "$run" "$vitcli" "$run")"; then
        echo "could not submit the merge job: run \`vitcli merge $run && vitcli report $run\` when the shards end" >&2
    fi
fi

# This task's share, recorded beside the other shards' in the shared run folder. exec: vitcli
# itself gets Slurm's signals (scancel, the time limit), saves what it finished and exits, so resubmitting the array
# resumes each shard where it stopped; and no child of this shell outlives a cancelled job (proctrack/linuxproc).
exec "$vitcli" run "$config" "$photos" -o "$out" --device "${DEVICE:-cuda}" -q --shard "$shard/$count" "$@"
