#!/usr/bin/env bash
# The GPU checks and the benchmark table of mmdinomamba, on a machine with a CUDA GPU.
# Set-up and the numbers to compare with: tools/gpu/README.md.
#
#   bash tools/gpu/run_gpu_checks.sh all               # check, then bench (the default)
#   bash tools/gpu/run_gpu_checks.sh check             # equivalence tests and kernel checks
#   bash tools/gpu/run_gpu_checks.sh bench [ARGS...]   # the backbone table (benchmark.py ARGS)
#   bash tools/gpu/run_gpu_checks.sh official [ARGS...]  # the official Dino-Mamba next to ours
#
# check: the `gpu` tests (Triton scan, our fused kernels, a DinoVim on the CUDA path against the
#        portable path), tools/gpu/gpu_check.py (bf16 errors against float64, per-variant layer
#        timings and memory) and tools/gpu/saved_activations.py (activation bytes per layer);
# bench: tools/analysis/benchmark.py, train step (forward, backward, AdamW) in bf16 autocast;
#        without ARGS the table of tools/gpu/README.md;
# official: tools/gpu/bench_official.py (needs .external/Dino-Mamba and causal-conv1d).
#
# Environment: PY (the Python to use; default .venv/bin/python when it exists, else python3),
# OUT (where the logs go; default work_dirs/gpu), TRITON_CACHE_AUTOTUNING (default 1). Exits
# non-zero when a step fails.
set -uo pipefail
cd "$(dirname "$0")/../.."
what=${1:-all}
shift || true
if [[ -z "${PY:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT=${OUT:-work_dirs/gpu}
export PYTHONUNBUFFERED=1
# keep Triton's autotuning results in its cache: a second run skips the minutes of autotuning
export TRITON_CACHE_AUTOTUNING=${TRITON_CACHE_AUTOTUNING:-1}
BENCH_DEFAULT=(--archs dinovim-t dinovim-s dinovim-b mambareg-b linearvit-b vit-b --ref vit-b
               --res 224 512 1024 --batch 64 16 4 --modes train)

case "$what" in
  check|bench|all|official) ;;
  *) echo "usage: bash tools/gpu/run_gpu_checks.sh [check|bench|all|official] [ARGS...]" >&2
     exit 2 ;;
esac
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "run_gpu_checks: $PY sees no CUDA device (torch.cuda.is_available() is False); these" \
       "checks need a CUDA GPU (see tools/gpu/README.md)" >&2
  exit 1
fi
"$PY" -c 'import torch, triton; print("torch", torch.__version__, "CUDA", torch.version.cuda,
      "triton", triton.__version__, "-", torch.cuda.get_device_name())'
mkdir -p "$OUT"

status=0
run() {  # run LOG CMD...: the command, its output also in $OUT/LOG
  local log=$1; shift
  echo "== $* (log: $OUT/$log)"
  "$@" 2>&1 | tee "$OUT/$log"
  local rc=${PIPESTATUS[0]}
  if [[ $rc -ne 0 ]]; then echo "== FAILED ($rc): $*" >&2; status=1; fi
}

if [[ $what == check || $what == all ]]; then
  run pytest_gpu.log "$PY" -m pytest tests/test_ops tests/test_models/test_mixers \
    tests/test_models/test_backbones -q -m gpu -p no:cacheprovider
  run gpu_check.log "$PY" tools/gpu/gpu_check.py
  run saved_activations.log "$PY" tools/gpu/saved_activations.py --arch b --res 224 \
    --project 24 64 224 --project 24 4 1024
fi
if [[ $what == bench || $what == all ]]; then
  args=("$@")
  [[ ${#args[@]} -eq 0 ]] && args=("${BENCH_DEFAULT[@]}")
  run benchmark.log "$PY" tools/analysis/benchmark.py --device cuda --amp "${args[@]}"
fi
if [[ $what == official ]]; then
  run bench_official.log "$PY" tools/gpu/bench_official.py "$@"
fi
exit $status
