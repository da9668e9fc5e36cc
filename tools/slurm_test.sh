#!/usr/bin/env bash
# Usage: [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [SRUN_ARGS="..."] \
#     bash tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [test.py args...]
# Starts GPUS tasks (GPUS_PER_NODE a node, one GPU each) with srun; each runs tools/test.py with
# --launcher slurm. Any further arguments go to test.py as they are (e.g. --work-dir D
# --out metrics.json). The Python is $PYTHON if set, else `python`.
set -euo pipefail
if [ "$#" -lt 4 ]; then
    echo "usage: bash $0 PARTITION JOB_NAME CONFIG CHECKPOINT [test.py args...]" >&2
    exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
CHECKPOINT=$4
shift 4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-""}
PYTHON=${PYTHON:-python}
TOOLS="$(cd "$(dirname "$0")" && pwd)"
if [ "$GPUS" -lt "$GPUS_PER_NODE" ]; then GPUS_PER_NODE=$GPUS; fi

# SRUN_ARGS is split into words on purpose (several srun options in one variable)
# shellcheck disable=SC2086
PYTHONPATH="$(dirname "$TOOLS")${PYTHONPATH:+:$PYTHONPATH}" \
srun -p "$PARTITION" \
    --job-name="$JOB_NAME" \
    --gres=gpu:"$GPUS_PER_NODE" \
    --ntasks="$GPUS" \
    --ntasks-per-node="$GPUS_PER_NODE" \
    --cpus-per-task="$CPUS_PER_TASK" \
    --kill-on-bad-exit=1 \
    $SRUN_ARGS \
    "$PYTHON" -u "$TOOLS/test.py" "$CONFIG" "$CHECKPOINT" --launcher=slurm "$@"
