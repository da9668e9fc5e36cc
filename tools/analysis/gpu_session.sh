#!/usr/bin/env bash
# One batched GPU session (device tool): install the carried wheels, then run the GPU checks.
#   bash tools/analysis/gpu_session.sh [check|bench|all] [extra benchmark args...]
# Wheels: .whl/ (pure-Python onedl-mmengine/mmcv(no ops)/mmpretrain, mamba_ssm), built by
# tools/analysis/prepare_gpu_wheels.sh and carried with the device tool. Logs go to $OUT when set.
set -uo pipefail
what=${1:-all}; shift || true
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
if [[ -d .whl ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
if [[ $what == check || $what == all ]]; then
  python3 tools/analysis/gpu_check.py 2>&1 | tee "$OUT/gpu_check.log"
  python3 -m pytest tests/test_ops tests/test_models/test_mixers tests/test_models/test_backbones \
    -q -m gpu -p no:cacheprovider \
    2>&1 | tail -15 | tee "$OUT/pytest_gpu.log"
fi
if [[ $what == bench || $what == all ]]; then
  python3 tools/analysis/benchmark.py --device cuda --amp "$@" 2>&1 | tee "$OUT/benchmark.log"
fi
