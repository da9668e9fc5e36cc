"""The loader of the native CPU kernels (``csrc/*.cpp``): :func:`kernels` is the compiled module,
whose functions ``csrc/bindings.cpp`` lists and the headers document.

The kernels do the bidirectional mixer's element-wise work (both directions' conv + SiLU, the
gated merge), the quadratic SSD scan's products and strongly decaying heads, the chunked scan,
the blocks' RMSNorm and the token-/channel-major copies, each in one or two passes over
cache-sized tiles (``at::parallel_for`` on torch's threads).

They are built once per machine and source version with ``torch.utils.cpp_extension`` (g++ and
ninja; ``-march=native``, the build keyed by the CPU's instruction-set flags and the sources'
paths and contents) into PyTorch's extension cache (``TORCH_EXTENSIONS_DIR``); a line is printed
before a build starts. After loading, the registered self-checks compare them once with the
PyTorch reference (:mod:`..reference`). If the build or a self-check fails, ONE warning names
the reason and the reference runs instead; nothing is retried or switched during a run.
``-ffast-math`` is a compile flag only: the library is linked without it, so loading it does
not switch the process to flushing subnormal floats to zero (tested).

Operands: float32 or float64, one dtype a call; *token-major* (b, L, c) tensors with unit
channel stride and tokens and samples apart (views into the projection are fine); *planes*
(b, R, h, p, L) with contiguous (p, L) planes (any strides outside them); per-token (b, R, h, L)
and matrix (b, R, g, L, L) tensors contiguous. The kernels check their operands and raise.
"""
import hashlib
import logging
import platform
import threading
import time
import warnings
from pathlib import Path

import torch
from torch import Tensor

from ..switch import kernels_enabled

__all__ = ['SOURCES', 'load', 'kernels', 'available', 'use_for', 'load_error',
           'register_self_check']

#: the kernels' sources: one concept a header, all compiled as the one translation unit of
#: ``bindings.cpp`` (their shared inline helpers stay internal)
CSRC = Path(__file__).parent / 'csrc'
SOURCES = (CSRC / 'bindings.cpp', )
#: -ffast-math lets g++ vectorize exp (glibc's vector math library); the kernels hold no
#: NaN / infinity tests that it could remove. -fopenmp: ``at::parallel_for`` is a header
#: template that runs its loop on torch's OpenMP threads only when the including file is compiled
#: with OpenMP; without it every kernel runs on one thread. -mprefer-vector-width=512: g++ tunes
#: Intel's AVX-512 cores for 256-bit vectors in the loops it vectorizes itself; with 512 the conv +
#: SiLU kernels ran 1.3x faster on a Cascade Lake Xeon (no effect where there is no AVX-512).
CFLAGS = ('-O3', '-march=native', '-mprefer-vector-width=512', '-ffast-math', '-fopenmp')
#: linked against the OpenMP runtime by its soname (libgomp.so.1): the process already holds
#: torch's copy, so the kernels share torch's thread pool and its thread count
LDFLAGS = ('-fopenmp', )

_lock = threading.RLock()  # reentrant: the self-check loads the module again
_state: dict = {}


def _build_key() -> str:
    """A short digest of what the build depends on: machine and instruction-set flags (what
    ``-march=native`` compiles for), torch version, compiler flags, and the source's path and
    contents (two checkouts or versions sharing one cache each keep their own build instead of
    rebuilding over each other's)."""
    flags = ''
    try:
        with open('/proc/cpuinfo') as f:
            flags = next((line for line in f if line.startswith(('flags', 'Features'))), '')
    except OSError:
        pass
    files = sorted(CSRC.glob('*.[ch]*'))
    source = b''.join(path.read_bytes() for path in files)
    text = '|'.join([platform.machine(), flags, torch.__version__, ' '.join(CFLAGS),
                     ' '.join(LDFLAGS), str(CSRC.resolve())])
    return hashlib.sha1(text.encode() + source).hexdigest()[:12]


def kernels():
    """The compiled module, whatever the switch says (a backward pass runs what its forward
    pass chose); call it only where :func:`available` said so, or from a self-check."""
    module = _module()
    if module is None:
        raise RuntimeError(f'mmdinomamba: the native CPU kernels are not in use: {load_error()}')
    return module


def load():
    """The compiled module (built on first call), or None inside
    :func:`~mmdinomamba.ops.reference_ops` or when not buildable (the reason in
    :func:`load_error`, and in one warning)."""
    return _module() if kernels_enabled() else None


def _module():
    """The compiled module, built and checked once per process, whatever the switch says now
    (:func:`kernels` runs what a forward pass chose, and its backward pass must not be turned
    away), or None."""
    with _lock:
        if 'module' not in _state:
            module, error = _build()
            if module is not None:
                _state['module'] = module  # the self-check calls the kernels through kernels()
                error = _self_check()
                if error is not None:
                    module = None
                    warnings.warn(f'mmdinomamba: the native CPU kernels failed their self-check, '
                                  f'the PyTorch reference runs instead (slower): {error}')
            _state['module'], _state['error'] = module, error
        return _state['module']


#: Largest relative error (norm) of any result of a self-check (the kernels and the reference
#: differ by about 1e-6 in float32: other rounding orders)
SELF_CHECK_TOL = 1e-5

#: The self-checks run once the kernels are loaded: functions returning what differs by more
#: than ``SELF_CHECK_TOL`` (or None), registered by the modules whose kernels they compare
#: with the reference (this module imports none of them)
_self_checks: list = []


def register_self_check(fn):
    """Registers ``fn`` (no arguments, returns an error text or None) as a self-check."""
    _self_checks.append(fn)
    return fn


def _self_check() -> str | None:
    """The first failure of the registered self-checks (a check that raises fails), or None."""
    for check in _self_checks:
        try:
            error = check()
        except Exception as exc:  # a kernel that rejects valid input, ...
            error = f'{type(exc).__name__}: {exc}'.strip()
        if error is not None:
            return error
    return None


def _build():
    try:
        # importing cpp_extension logs "No CUDA runtime is found" on CPU-only machines
        ext_logger = logging.getLogger('torch.utils.cpp_extension')
        level = ext_logger.level
        ext_logger.setLevel(logging.ERROR)
        try:
            from torch.utils.cpp_extension import load as load_extension
        finally:
            ext_logger.setLevel(level)
        name = f'mmdinomamba_cpu_{_build_key()}'
        if not _built(name):  # say so before the wait, not after it
            print('mmdinomamba: compiling the native CPU kernels (about a minute, once per '
                  'machine and source version) ...', flush=True)
        start = time.perf_counter()
        # copies of the flags: load() appends torch's libraries to the lists it is given, and
        # the flags make the build key
        module = load_extension(name=name, sources=[str(p) for p in SOURCES],
                                extra_cflags=list(CFLAGS), extra_ldflags=list(LDFLAGS),
                                verbose=False)
        seconds = time.perf_counter() - start
        if seconds > 5:
            print(f'mmdinomamba: built the native CPU kernels in {seconds:.0f} s', flush=True)
        return module, None
    except Exception as exc:  # no compiler, no ninja, a read-only cache, ...
        error = f'{type(exc).__name__}: {exc}'.strip()
        warnings.warn(f'mmdinomamba: the native CPU kernels could not be built, the PyTorch '
                      f'reference runs instead (slower). Reason: {error[-2000:]}')
        return None, error


def _built(name: str) -> bool:
    """Whether the extension cache already holds the library ``name``."""
    from torch.utils.cpp_extension import _get_build_directory
    try:
        return (Path(_get_build_directory(name, verbose=False)) / f'{name}.so').exists()
    except Exception:  # a private helper of torch: if it moved, just say nothing
        return True


def available() -> bool:
    """Whether the native kernels are in use (builds them on first call)."""
    return load() is not None


def use_for(t: Tensor) -> bool:
    """Whether a call on ``t`` runs the native kernels: a CPU tensor, outside
    :func:`~mmdinomamba.ops.reference_ops`, not while ``torch.compile`` traces a function that
    calls them directly (the compiler cannot see into them; the custom ops of
    :mod:`.custom_ops` it sees as one node), and the kernels built."""
    return (t.device.type == 'cpu' and not torch.compiler.is_compiling() and available())


def load_error() -> str | None:
    """Why the kernels are not in use: the build's error or the failed self-check (None if
    neither failed or nothing was tried)."""
    return _state.get('error')


