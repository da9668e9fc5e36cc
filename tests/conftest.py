"""Shared pytest setup: deterministic, few threads, `gpu` marker skipped without CUDA; a runner
of scripts under Triton's CPU interpreter."""
import importlib.util
import os
import subprocess
import sys

os.environ.setdefault('OMP_NUM_THREADS', '2')
os.environ.setdefault('MKL_NUM_THREADS', '2')

import pytest  # noqa: E402
import torch  # noqa: E402

import mmdinomamba  # noqa: E402,F401  (registers modules, patches config scopes)

torch.set_num_threads(int(os.environ['OMP_NUM_THREADS']))
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason='needs CUDA')
    for item in items:
        if 'gpu' in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope='session')
def embedded_root(tmp_path_factory):
    """A small embedded data set generated once per test run."""
    from mmdinomamba.datasets.embedded import generate_embedded_dataset
    root = tmp_path_factory.mktemp('embedded')
    generate_embedded_dataset(root, num_train=48, num_val=16, img_size=64, seed=0)
    return root


@pytest.fixture(autouse=True)
def _isolate_default_scope():
    """Runners built by a test set mmengine's global default scope (e.g. 'mmseg'); restore it so
    that later tests building mmpretrain modules see the registry state they expect."""
    from mmengine.registry import DefaultScope
    saved = DefaultScope._instance_dict.copy()
    yield
    DefaultScope._instance_dict.clear()
    DefaultScope._instance_dict.update(saved)


@pytest.fixture
def run_interpreted():
    """``run(code) -> stdout`` of ``code`` run in a fresh Python with ``TRITON_INTERPRET=1``
    (Triton kernels then run on CPU tensors; ``import kernel_interpreter`` routes the whole
    CUDA fast path there); skips without Triton, fails with the script's stderr if it exits
    non-zero."""
    if importlib.util.find_spec('triton') is None:
        pytest.skip('needs triton')

    def run(code: str, timeout: int = 240) -> str:
        tests = os.path.join(REPO, 'tests')  # for ``import kernel_interpreter``
        path = os.pathsep.join(p for p in (REPO, tests, os.environ.get('PYTHONPATH')) if p)
        env = dict(os.environ, TRITON_INTERPRET='1', PYTHONPATH=path)
        proc = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True,
                              text=True, timeout=timeout)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    return run


@pytest.fixture
def kernels_as_on_cuda(monkeypatch):
    """``route(**kernels)``: CPU tensors take the dispatchers' kernel branch (as CUDA tensors
    do), with exactly the given kernel-cache entries (e.g. ``bidir_merge=fn``) and every other
    optional kernel absent; restored after the test."""
    from mmdinomamba.ops.cuda import _triton

    def route(**kernels):
        monkeypatch.setattr(_triton, 'on_kernel_device', lambda x: True)
        monkeypatch.setattr(_triton, '_cache', {
            key: kernels.get(key)
            for key in ('scan', 'norm', 'conv', 'bidir_conv', 'bidir_merge')
        })

    return route
