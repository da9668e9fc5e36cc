#!/usr/bin/env bash
# Usage: [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [SRUN_ARGS="..."] \
#     bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py args...]
# Starts GPUS tasks (GPUS_PER_NODE a node, one GPU each) with srun; each runs tools/train.py with
# --launcher slurm. Any further arguments go to train.py as they are (the PY_ARGS of the
# OpenMMLab scripts, e.g. --resume --cfg-options ...). The Python is $PYTHON if set, else
# `python` (the one of the environment srun starts the tasks in).
set -euo pipefail
if [ "$#" -lt 4 ]; then
    echo "usage: bash $0 PARTITION JOB_NAME CONFIG WORK_DIR [train.py args...]" >&2
    exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
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
    "$PYTHON" -u "$TOOLS/train.py" "$CONFIG" --work-dir="$WORK_DIR" --launcher=slurm "$@"
