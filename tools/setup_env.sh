#!/usr/bin/env bash
# Create (or reuse) the project virtualenv with the measured recipe of docs/install.md.
#
#   bash tools/setup_env.sh            # environment in ./.venv (CPU; GPU-ready)
#
# mamba-ssm is always installed, as a pure-Python package (~5 s): its Triton SSD kernels are the
# CUDA scan, and the tests run them on CPU under Triton's interpreter. TensorBoard (optional,
# prebuilt wheels, ~7 s) is installed for `tools/train.py --tensorboard`.
#
# Environment variables:
#   VENV            where the virtualenv lives                (default: ./.venv)
#   MMDM_CACHE      where the compiled mmcv wheel is cached   (default: ~/.cache/mmdinomamba)
#
# The mmcv wheel (the only slow step, 7.5-19 min on 2 cores) is cached under MMDM_CACHE keyed by
# the Python, torch and mmcv versions, so a later run re-uses it; without a cache it is built.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
CACHE=${MMDM_CACHE:-$HOME/.cache/mmdinomamba}

TORCH=2.14.1
TORCHVISION=0.29.1
MMCV=2.3.6
PY=${PYTHON:-python3}

log() { printf '[setup_env %(%H:%M:%S)T] %s\n' -1 "$*"; }

# The stamp records the recipe; when requirements change, the venv is brought up to date.
recipe_hash=$(cat requirements/*.txt tools/setup_env.sh setup.py | sha1sum | cut -c1-12)
stamp="$VENV/.mmdm-setup-$recipe_hash"
if [[ -f "$stamp" ]]; then
  log "environment $VENV is up to date ($stamp)"
  exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
# pip warns once per index location that a pip.conf lists but that does not exist; drop only
# that line so real warnings stay visible.
pip_run() {
  "${PIP[@]}" "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}
PYV=$("$VENV/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')

log "step 1/5: torch==$TORCH torchvision==$TORCHVISION"
pip_run install -q "torch==$TORCH" "torchvision==$TORCHVISION"

log "step 2/5: mmengine, build tools"
pip_run install -q onedl-mmengine==0.10.12 ninja wheel "setuptools<81"

# mmcv: compiled ops are needed by mmdet (RoIAlign, NMS). Pitfalls handled here:
#  - build isolation silently drops the ops -> --no-build-isolation after torch is installed;
#  - torch >= 2.14 headers need C++20 but mmcv forces -std=c++17 -> a g++ wrapper rewrites it;
#  - pip's wheel cache may hand back a wheel built against another torch -> our own cache keyed
#    by python/torch/mmcv versions, and --no-cache-dir for the build.
if ! "$VENV/bin/python" -c 'from mmcv.ops import nms, RoIAlign' 2>/dev/null; then
  wheel_dir="$CACHE/wheels/mmcv-$MMCV-torch$TORCH-$PYV-$(uname -m)"
  if ! ls "$wheel_dir"/*.whl >/dev/null 2>&1; then
    log "step 3/5: compiling onedl-mmcv==$MMCV (7.5-19 minutes on 2 cores) -> $wheel_dir"
    tmp=$(mktemp -d)
    cat > "$tmp/cxx20" <<'WRAP'
#!/usr/bin/env bash
args=(); for a in "$@"; do [[ "$a" == "-std=c++17" ]] && a="-std=c++20"; args+=("$a"); done
exec g++ "${args[@]}"
WRAP
    chmod +x "$tmp/cxx20"
    mkdir -p "$tmp/out"
    MAX_JOBS=${MAX_JOBS:-2} CXX="$tmp/cxx20" MMCV_WITH_OPS=1 FORCE_CUDA=0 \
      pip_run wheel -q --no-build-isolation --no-deps --no-cache-dir \
      -w "$tmp/out" "onedl-mmcv==$MMCV"
    mkdir -p "$wheel_dir"
    mv "$tmp/out"/*.whl "$wheel_dir/"
    rm -rf "$tmp"
  else
    log "step 3/5: re-using cached mmcv wheel from $wheel_dir"
  fi
  pip_run install -q "$wheel_dir"/*.whl
  "$VENV/bin/python" -c 'from mmcv.ops import nms, RoIAlign' \
    || { echo "mmcv was installed without its compiled ops: remove $wheel_dir and re-run" >&2; exit 1; }
else
  log "step 3/5: mmcv with compiled ops already installed"
fi

log "step 4/5: mmpretrain, mmsegmentation, mmdetection, runtime, test and optional requirements"
pip_run install -q -r requirements/mminstall.txt -r requirements/runtime.txt \
  -r requirements/tests.txt -r requirements/optional.txt
# transformers 5.x breaks mmpretrain.models; only constrain it if something pulled it in.
if "$VENV/bin/python" -c 'import transformers' 2>/dev/null; then
  pip_run install -q "transformers<5"
fi

log "step 5/5: mamba-ssm (pure Python, no CUDA build, no deps)"
MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE \
  pip_run install -q --no-build-isolation --no-deps mamba-ssm==2.3.2.post1

log "installing mmdinomamba in editable mode"
pip_run install -q --no-deps --no-build-isolation -e .
"$VENV/bin/python" -c 'import mmdinomamba, mmpretrain.models, mmseg.models, mmdet.models; print("mmdinomamba", mmdinomamba.__version__, "ready")'
# the native CPU kernels (mmdinomamba/ops/cpu/csrc) are built on first use; build them now so that
# the first run does not wait for the compiler (a failed build is not fatal: PyTorch ops run)
log "building the native CPU kernels (30-45 s)"
"$VENV/bin/python" -c 'from mmdinomamba.ops import native_cpu as n; import sys; sys.exit(0 if n.available() else 1)' \
  || echo "warning: the native CPU kernels could not be built (see above); the slower PyTorch ops run instead" >&2
rm -f "$VENV"/.mmdm-setup-*
touch "$stamp"
log "done"
