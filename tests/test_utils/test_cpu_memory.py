"""keep_freed_cpu_memory: applied on glibc, a no-op elsewhere (run in a fresh process: it is a
setting of the whole process)."""
import platform
import subprocess
import sys


def test_applies_on_glibc_only_and_torch_still_computes():
    code = ('import torch\nfrom mmdinomamba.utils.cpu_memory import keep_freed_cpu_memory\n'
            'print(keep_freed_cpu_memory())\nprint(float(torch.ones(1 << 22).sum()))')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         check=True).stdout.split()
    glibc = platform.system() == 'Linux' and platform.libc_ver()[0] == 'glibc'
    assert out[-2:] == [str(glibc), str(float(1 << 22))]


def _cli_setting(env_value):
    import os
    env = dict(os.environ)
    env.pop('MMDINOMAMBA_KEEP_FREED_MEMORY', None)
    if env_value is not None:
        env['MMDINOMAMBA_KEEP_FREED_MEMORY'] = env_value
    code = ('import torch\nfrom mmdinomamba.utils.cli import keep_freed_memory_on_cpu\n'
            'print(keep_freed_memory_on_cpu(), torch.cuda.is_available())')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env,
                         check=True).stdout.split()
    return out[-2] == 'True', out[-1] == 'True'


def test_train_and_test_tools_keep_freed_memory_on_cpu_unless_turned_off():
    """tools/train.py and tools/test.py call keep_freed_memory_on_cpu: applied without CUDA on
    glibc, never with MMDINOMAMBA_KEEP_FREED_MEMORY=0."""
    glibc = platform.system() == 'Linux' and platform.libc_ver()[0] == 'glibc'
    applied, cuda = _cli_setting(None)
    assert applied == (glibc and not cuda)
    assert _cli_setting('0')[0] is False
    for tool in ('tools/train.py', 'tools/test.py'):
        with open(tool) as f:
            assert 'keep_freed_memory_on_cpu()' in f.read(), tool
