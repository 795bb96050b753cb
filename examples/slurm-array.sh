#!/usr/bin/env bash
# configs/sweep.toml over a folder as a Slurm array job: four shards, one GPU each; when all four have ended, a
# dependent job merges their manifests and writes the HTML report.
#
# Usage, from the repository root (after `make install`):  sbatch examples/slurm-array.sh PHOTOS_DIR
# Results: outputs/sweep/ (summary.csv, manifest.json, report.html). Change --array and the shard count together:
# each task takes the K-th of N shares of the sorted images (N = the number of tasks), so the shares never overlap.
#
#SBATCH --job-name=vitcli-sweep
#SBATCH --array=1-4
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=4
#SBATCH --mem=16G
#SBATCH --time=04:00:00
#SBATCH --output=vitcli-sweep-%A_%a.log
set -euo pipefail

photos=${1:?usage: sbatch examples/slurm-array.sh PHOTOS_DIR}
out=${OUT:-outputs}
cd "${SLURM_SUBMIT_DIR:-.}"
vitcli=.venv/bin/vitcli

# The first task submits the merge-and-report job once. afterany: it runs even if a shard ended with exit 1 (some
# images failed; their failures are in the shard's manifest and stay visible in the merged one and the report).
if [[ ${SLURM_ARRAY_TASK_ID} == "${SLURM_ARRAY_TASK_MIN:-1}" ]]; then
    sbatch --dependency="afterany:${SLURM_ARRAY_JOB_ID}" --job-name=vitcli-sweep-merge --time=00:30:00 \
        --output=vitcli-sweep-merge-%j.log \
        --wrap="$vitcli merge '$out/sweep' && $vitcli report '$out/sweep'"
fi

# This task's share: manifest-shardKofN.json and summary-shardKofN.csv in the shared output folder. Resubmitting
# the array after a timeout resumes each shard where it stopped.
"$vitcli" run configs/sweep.toml "$photos" -o "$out" --device cuda -q \
    --shard "${SLURM_ARRAY_TASK_ID}/${SLURM_ARRAY_TASK_COUNT}"
