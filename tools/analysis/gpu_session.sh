#!/usr/bin/env bash
# One batched GPU session (device tool): install the carried wheels, then run the GPU checks.
#   bash tools/analysis/gpu_session.sh [check|bench|all] [extra benchmark args...]
#   bash tools/analysis/gpu_session.sh official [bench_official args...]
#     (the official Dino-Mamba model next to ours; needs .external from
#     prepare_gpu_wheels.sh --official; builds causal_conv1d into .cc1d/ once per warm machine)
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
  python3 tools/analysis/saved_activations.py --arch b --res 224 --project 24 64 224 \
    --project 24 4 1024 2>&1 | tee "$OUT/saved_activations.log"
  python3 -m pytest tests/test_ops tests/test_models/test_mixers tests/test_models/test_backbones \
    -q -m gpu -p no:cacheprovider \
    2>&1 | tail -15 | tee "$OUT/pytest_gpu.log"
fi
if [[ $what == bench || $what == all ]]; then
  python3 tools/analysis/benchmark.py --device cuda --amp "$@" 2>&1 | tee "$OUT/benchmark.log"
fi
if [[ $what == official ]]; then
  cc1d_ok() { PYTHONPATH=$PWD/.cc1d:${PYTHONPATH:-} python3 -c 'import causal_conv1d_cuda'; }
  if ! cc1d_ok 2>/dev/null; then
    src=$(ls .external/causal_conv1d-*.tar.gz | head -1)
    tmp=$(mktemp -d) && tar -xzf "$src" -C "$tmp"
    # build for Hopper (sm_90: H100, H200) only, not its ten default architectures: turn every
    # other `-gencode` pair of its setup.py into `pass`
    python3 - "$tmp"/causal_conv1d-*/setup.py <<'PY' || exit 1
import re, sys
text = open(sys.argv[1]).read()
pair = (r'^([ \t]*)cc_flag\.append\("-gencode"\)\s*\n\s*'
        r'cc_flag\.append\("arch=compute_(?!90,)\d+,code=sm_\d+"\)\n')
text, n = re.subn(pair, r'\1pass\n', text, flags=re.M)
compile(text, sys.argv[1], 'exec')
open(sys.argv[1], 'w').write(text)
print(f'causal_conv1d: {n} architectures other than sm_90 dropped')
PY
    start=$SECONDS
    (cd "$tmp"/causal_conv1d-* && CAUSAL_CONV1D_FORCE_BUILD=TRUE MAX_JOBS=16 \
      NVCC_APPEND_FLAGS='--threads 4' python3 -m pip install -q --no-build-isolation --no-deps \
      --no-index --no-cache-dir --target "$OLDPWD/.cc1d" .) || exit 1
    echo "causal_conv1d built in $((SECONDS - start)) s"
  fi
  PYTHONPATH=$PWD/.cc1d:${PYTHONPATH:-} python3 tools/analysis/bench_official.py "$@" 2>&1 \
    | tee "$OUT/bench_official.log"
fi
