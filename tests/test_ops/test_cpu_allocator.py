"""keep_freed_cpu_memory: applied on glibc, a no-op elsewhere (run in a fresh process: it is a
setting of the whole process)."""
import platform
import subprocess
import sys


def test_applies_on_glibc_only_and_torch_still_computes():
    code = ('import torch\nfrom mmdinomamba.ops import keep_freed_cpu_memory\n'
            'print(keep_freed_cpu_memory())\nprint(float(torch.ones(1 << 22).sum()))')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         check=True).stdout.split()
    glibc = platform.system() == 'Linux' and platform.libc_ver()[0] == 'glibc'
    assert out[-2:] == [str(glibc), str(float(1 << 22))]
