"""tools/gpu/run_gpu_checks.sh: a clear answer without a GPU, and a usage line for a wrong step."""
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
SCRIPT = osp.join(REPO, 'tools', 'gpu', 'run_gpu_checks.sh')


def _run(*args, out=None):
    env = dict(os.environ, PY=sys.executable, OUT=str(out or osp.join(REPO, 'work_dirs', 'gpu')))
    return subprocess.run(['bash', SCRIPT, *args], capture_output=True, text=True, env=env,
                          cwd=REPO)


def test_script_parses():
    assert subprocess.run(['bash', '-n', SCRIPT]).returncode == 0


def test_unknown_step_prints_the_usage():
    done = _run('nope')
    assert done.returncode == 2 and 'usage: bash tools/gpu/run_gpu_checks.sh' in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason='a CUDA device is there')
def test_without_cuda_it_says_so(tmp_path):
    done = _run('check', out=tmp_path / 'logs')
    assert done.returncode == 1 and 'sees no CUDA device' in done.stderr
    assert not (tmp_path / 'logs').exists()
