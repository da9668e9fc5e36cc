# The two commands of the README. Each sets up the environment (./.venv) first; that step is a
# no-op when the environment is already up to date.
#   make demo   set up + the main job on the embedded demo data (DINO -> Binary-AUC -> probe)
#   make test   set up + the test suite (what CI runs: .ci/run)
PY := .venv/bin/python
export OMP_NUM_THREADS ?= 2
export PYTHONUNBUFFERED := 1

.PHONY: setup demo test test-fast sanitize lint clean-demo

setup:
	bash tools/setup_env.sh

demo: setup
	$(PY) tools/demo.py --work-dir work_dirs/demo

test: setup
	$(PY) -m pytest tests -q -p no:cacheprovider

test-fast: setup
	$(PY) -m pytest tests -q -m "not slow" -p no:cacheprovider

# the tests that run the native CPU kernels, with the kernels built under AddressSanitizer and
# UndefinedBehaviorSanitizer (gcc's libasan, libubsan; a separate extension cache under work_dirs/)
sanitize: setup
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libstdc++.so)" \
	ASAN_OPTIONS=detect_leaks=0 TORCH_EXTENSIONS_DIR=$(CURDIR)/work_dirs/asan_extensions \
	PYTHONPATH=tests $(PY) -m pytest tests/test_ops tests/test_models/test_mixers -q \
	  -m "not gpu" -p no:cacheprovider -p asan_native --capture=sys

lint:
	$(PY) -m flake8 mmdinomamba tools tests || true

clean-demo:
	rm -rf work_dirs/demo data/embedded
