"""pytest plugin of ``make sanitize``: the native CPU kernels built with AddressSanitizer and
UndefinedBehaviorSanitizer.

Loaded with ``-p asan_native`` (``tests`` on ``PYTHONPATH``) in a process that has gcc's
``libasan`` (and ``libstdc++``) preloaded, as the Makefile target does. The kernels are then
compiled at ``-O1`` with ``-fsanitize=address,undefined`` (a build key of their own, so the
optimized build in the same cache stays), and any test that runs them stops at the first read or
write outside a tensor's memory, or the first undefined operation, with the sanitizer's report.
The build also orders floating-point operations differently from the optimized one, which tests
that the kernels' results do not hang on one compiler's choices under ``-ffast-math``.
"""
import pytest

SANITIZE = ('-O1', '-g', '-fsanitize=address,undefined', '-fno-sanitize-recover=undefined',
            '-fno-omit-frame-pointer')


def _asan_loaded() -> bool:
    with open('/proc/self/maps') as f:
        return any('libasan' in line for line in f)


def pytest_configure(config):
    if not _asan_loaded():
        raise pytest.UsageError(
            'asan_native: AddressSanitizer is not loaded in this process; run `make sanitize` '
            '(it preloads gcc\'s libasan.so and libstdc++.so)')
    from mmdinomamba.ops import native_cpu
    native_cpu.CFLAGS = tuple(f for f in native_cpu.CFLAGS if f != '-O3') + SANITIZE
    native_cpu.LDFLAGS = tuple(native_cpu.LDFLAGS) + ('-fsanitize=address,undefined', )
