#!/usr/bin/env bash
# Usage: bash tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCESSES [test.py args...]
# One process per GPU; without CUDA the processes run on CPUs (gloo backend). The Python is
# $PYTHON if set, else the project's .venv/bin/python if it exists, else `python`.
CONFIG=$1
CHECKPOINT=$2
GPUS=$3
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python; fi
fi

PYTHONPATH="$ROOT":$PYTHONPATH \
"$PYTHON" -m torch.distributed.run \
    --nnodes=$NNODES --node_rank=$NODE_RANK --master_addr=$MASTER_ADDR \
    --nproc_per_node=$GPUS --master_port=$PORT \
    "$ROOT/tools/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "${@:4}"
