#!/usr/bin/env bash
# Build the wheels a bare GPU image needs to run mmdinomamba's GPU checks and benchmarks, into
# ./.whl (ignored by git). The GPU image (device tool) has Python 3.12, torch, triton, einops,
# opencv, matplotlib, rich, pyyaml, but no OpenMMLab packages and no mamba_ssm; nothing can be
# downloaded there, so everything travels as pure-Python wheels:
#
#   onedl-mmengine, onedl-mmpretrain + their small pure-Python deps (addict, yapf, termcolor,
#   platformdirs, mat4py, model-index, ordered-set, importlib-metadata), onedl-mmcv built
#   WITHOUT its compiled ops (in an isolated build: the backbones, mixers and DINO need no mmcv
#   op), and mamba_ssm 2.3.2.post1 as a pure-Python wheel (its Triton SSD kernels need no
#   compiled extension).
#
#   bash tools/analysis/prepare_gpu_wheels.sh            # -> .whl/*.whl
#   # then, with the device tool: carry ['.whl'] and run
#   bash tools/analysis/gpu_session.sh all --res 224 512 1024 --batch 64 16 4 --modes train
#
#   bash tools/analysis/prepare_gpu_wheels.sh --official # also, for bench_official.py:
#   # .external/Dino-Mamba (the three model files of the official code, from a `fetch`ed mirror
#   # at $DINOMAMBA_GIT_DIR) and .external/causal_conv1d-1.7.0.tar.gz (built on the GPU machine
#   # by `gpu_session.sh official`); carry ['.whl', '.external']. Never committed (.gitignore).
#
# Needs the project venv (tools/setup_env.sh) for the two local builds; about a minute.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=${WHEEL_DIR:-.whl}
PIP=("$PY" -m pip --disable-pip-version-check)
mkdir -p "$OUT"

# Pure-Python packages (some are published as sdists only, so build rather than download).
"${PIP[@]}" wheel -q --no-deps -w "$OUT" onedl-mmengine==0.10.12 onedl-mmpretrain==1.3.6 \
  addict yapf termcolor platformdirs mat4py modelindex model-index ordered-set importlib-metadata \
  2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)

# mmcv without compiled ops: a pure-Python wheel, built here from the sdist. mmcv's setup.py
# skips its ops exactly when torch does not import, which is the case in pip's isolated build
# environment (the pitfall of ../shared/DEPENDENCIES.md, used on purpose here).
if ! ls "$OUT"/onedl_mmcv-*.whl >/dev/null 2>&1; then
  "${PIP[@]}" wheel -q --no-deps --no-cache-dir -w "$OUT" onedl-mmcv==2.3.6 \
    2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
fi
# mamba_ssm as a pure-Python wheel (no CUDA build, no download of a prebuilt wheel).
if ! ls "$OUT"/mamba_ssm-*.whl >/dev/null 2>&1; then
  MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE "${PIP[@]}" wheel -q --no-deps \
    --no-build-isolation --no-cache-dir -w "$OUT" mamba-ssm==2.3.2.post1
fi
# Any wheel tagged for this machine's Python (e.g. cp311) would not install on 3.12.
for w in "$OUT"/*.whl; do
  case "$w" in
    *-py3-none-any.whl|*-py2.py3-none-any.whl|*-cp312-*) ;;
    *) echo "not pure Python, will not install on the GPU image: $w" >&2; exit 1 ;;
  esac
done
du -ch "$OUT"/*.whl | tail -1
ls "$OUT"

if [[ "${1:-}" == "--official" ]]; then
  git_dir=${DINOMAMBA_GIT_DIR:-/work/.mirror/yangtiming+Dino-Mamba/repo}
  if [[ ! -d "$git_dir" ]]; then
    echo "no Dino-Mamba mirror at $git_dir (fetch it, or set DINOMAMBA_GIT_DIR)" >&2
    exit 1
  fi
  mkdir -p .external/Dino-Mamba
  for f in models_vim.py mamba2.py rope.py; do
    git --git-dir="$git_dir" show "HEAD:$f" > ".external/Dino-Mamba/$f"
  done
  if ! ls .external/causal_conv1d-*.tar.gz >/dev/null 2>&1; then
    "${PIP[@]}" download -q --no-deps --no-binary :all: --no-build-isolation -d .external \
      causal-conv1d==1.7.0 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
  fi
  ls .external .external/Dino-Mamba
fi
