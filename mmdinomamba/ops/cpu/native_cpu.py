"""The loader of the native CPU kernels (``csrc/*.cpp``) and thin typed wrappers of them.

The kernels do the bidirectional mixer's element-wise work (both directions' conv + SiLU, the
gated merge), the quadratic SSD scan's products and strongly decaying heads, the recurrence for
small heads, the chunked scan, the blocks' RMSNorm and the token-/channel-major copies, each in
one or two passes over cache-sized tiles (``at::parallel_for`` on torch's threads).

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
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from ..switch import kernels_enabled

__all__ = ['SOURCES', 'load', 'available', 'use_for', 'load_error', 'register_self_check',
           'conv_silu_forward', 'conv_silu_backward', 'merge_forward', 'merge_backward',
           'merge_backward_scan', 'wide_forward', 'wide_backward', 'products_forward',
           'products_backward', 'scan_factors', 'scan_steps', 'column_products',
           'masked_outer', 'rms_norm_forward', 'rms_norm_backward', 'recurrent_fits',
           'recurrent_scan_forward', 'recurrent_scan_backward', 'chunk_scan_forward',
           'chunk_scan_backward']

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


def load():
    """The compiled module (built on first call), or None inside
    :func:`~mmdinomamba.ops.reference_ops` or when not buildable (the reason in
    :func:`load_error`, and in one warning)."""
    return _module() if kernels_enabled() else None


def _module():
    """The compiled module, built and checked once per process, whatever the switch says now:
    the calls below run what a forward pass chose, and its backward pass must not be turned
    away."""
    with _lock:
        if 'module' not in _state:
            module, error = _build()
            if module is not None:
                _state['module'] = module  # the self-check calls the kernels through here
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


def conv_silu_forward(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """Both directions' depthwise conv + SiLU, channel-major in the original token order
    (direction 1 anti-causal there; :func:`~mmdinomamba.ops.reference.bidir_causal_conv1d_ref`
    of the flipped sequence read back): (b, 2, C, L) from the token-major ``x`` (b, L, C),
    ``weight`` (2, C, K) and ``bias`` (2, C) of ``x``'s dtype (K from 2 to 4)."""
    return _module().conv_silu_forward(x, weight.contiguous(),
                                    None if bias is None else bias.contiguous())


def conv_silu_backward(dact: Tensor | Sequence[Tensor], x: Tensor, weight: Tensor,
                       bias: Tensor | None, dx: Tensor) -> tuple[Tensor, Tensor | None]:
    """Gradients of :func:`conv_silu_forward` for ``dact`` (b, 2, C, L), or its channel ranges
    as one to three parts (b, 2, C_i, L) in channel order (e.g. the scan's ``du``, ``dB``,
    ``dC``, which are then never concatenated): writes the input's into the token-major ``dx``
    (b, L, C) (like ``x``) and returns ``dweight`` (2, C, K) and ``dbias`` (2, C) or None (the
    pre-activations are recomputed)."""
    parts = [dact] if isinstance(dact, Tensor) else list(dact)
    grads = _module().conv_silu_backward(parts, x, weight.contiguous(),
                                         None if bias is None else bias.contiguous(), dx)
    return grads[0], grads[1] if bias is not None else None


def merge_forward(y: Tensor, z: Tensor, weight: Tensor, groups: int, eps: float,
                  out: Tensor) -> Tensor:
    """``(rmsnorm(y_0 silu(z)) w_0 + rmsnorm(y_1 silu(z)) w_1) / 2`` of the channel-major ``y``
    (b, 2, d, L) and the token-major ``z`` (b, L, d), the root mean square over ``groups``
    groups of channels, written into the token-major ``out`` (b, L, d), which is returned."""
    _module().merge_forward(y, z, weight.contiguous(), groups, eps, out)
    return out


def merge_backward(dm: Tensor, y: Tensor, z: Tensor, weight: Tensor, groups: int, eps: float,
                   dz: Tensor, out: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Gradients of :func:`merge_forward` for the token-major ``dm`` (b, L, d): writes ``dz``
    into the token-major ``dz`` (b, L, d) and returns ``dy`` (b, 2, d, L) and ``dweight``
    (2, d); with ``out`` (token-major like ``dz``), writes :func:`merge_forward`'s output into
    it too, from the values the gradients are computed from (to rounding, the forward pass's
    result)."""
    dy, dweight = _module().merge_backward(dm, y, z, weight.contiguous(), groups, eps, dz, out)
    return dy, dweight


def merge_backward_scan(dm: Tensor, ys: Tensor, row: Tensor, x: Tensor, diag: Tensor,
                        wide: Tensor, parts: Tensor | None, z: Tensor, weight: Tensor,
                        groups: int, eps: float, dz: Tensor,
                        out: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """:func:`merge_backward` of the quadratic scan's output ``y = ys row + x diag`` (``ys``,
    ``x`` (b, 2, h, p, L) planes, ``row``, ``diag`` (b, 2, h, L)) plus, at the heads ``wide``
    (b, 2, h) marks, their ``parts`` (N, p, L) in :func:`wide_forward`'s order, rebuilt tile by
    tile inside the kernel instead of read: the same gradients and ``out`` without ``y`` in
    memory. Returns ``dy`` (b, 2, h p, L) and ``dweight`` (2, h p)."""
    dy, dweight = _module().merge_backward_scan(dm, ys, row.contiguous(), x, diag.contiguous(),
                                                wide.contiguous(), parts, z,
                                                weight.contiguous(), groups, eps, dz, out)
    return dy, dweight


def wide_forward(x: Tensor, dt: Tensor, S: Tensor, cb: Tensor, wide: Tensor,
                 bounds: list[int], y: Tensor) -> Tensor:
    """Adds the share of the quadratic scan's strongly decaying heads (those ``wide`` (b, R, h)
    marks; ``csrc/wide_fused.h``) to ``y`` in place and returns it (N, p, L), by direction, then
    sample, then head; ``x``, ``y`` (b, R, h, p, L) planes, ``dt``, ``S`` (float64) per-token,
    ``cb`` (b, R, g, L, L), the products per token block of ``bounds``."""
    return _module().wide_forward(x, dt, S, cb, wide, list(bounds), y)


def wide_backward(dy: Tensor, x: Tensor, dt: Tensor, S: Tensor, cb: Tensor, wide: Tensor,
                  bounds: list[int], dx: Tensor, ddt: Tensor, dS: Tensor,
                  dcb: Tensor) -> Tensor:
    """Gradients of :func:`wide_forward`: adds the ``wide`` heads' gradients to ``dx`` (like
    ``x``), ``ddt``, ``dS`` (like ``dt``) and ``dcb`` (like ``cb``) in place and returns their
    ``dA`` (R, h) in float64 (operands as :func:`wide_forward`)."""
    return _module().wide_backward(dy, x, dt, S, cb, wide, list(bounds), dx, ddt, dS, dcb)


def products_forward(x: Tensor, s: Tensor, cb: Tensor, row: Tensor, diag: Tensor,
                     bounds: list[int]) -> tuple[Tensor, Tensor]:
    """The quadratic form's factored products with their element-wise work, per (sample,
    direction, group) in one pass: ``ys = xs @ cb^T`` per group (``xs = x s``, the heads of
    a group side by side) and ``y = ys row + x diag``, both (b, R, h, p, L) and contiguous;
    ``x`` planes, ``s``, ``row``, ``diag`` (b, R, h, L) and ``cb`` (b, R, g, L, L), the products
    per token block of ``bounds`` (:func:`.ssd_quadratic.block_bounds`)."""
    ys, y = _module().products_forward(x, s, cb, row, diag, list(bounds))
    return ys, y


def products_backward(dy: Tensor, x: Tensor, ys: Tensor, s: Tensor, row: Tensor,
                      diag: Tensor, cb: Tensor, bounds: list[int]) -> tuple[Tensor, ...]:
    """Gradients of :func:`products_forward`'s products for ``dy`` (like ``x``): ``dx = dxs s +
    dy diag`` (``dxs = dys @ cb`` per group, ``dys = dy row``), ``dcb = dys^T @ xs`` on each
    direction's strict triangle (zero elsewhere), and the per-token sums over ``p`` of ``dxs
    x``, ``dys ys`` and ``dy x`` (b, R, h, L)."""
    dx, dcb, dxs_x, dys_ys, dy_x = _module().products_backward(dy, x, ys, s, row, diag, cb,
                                                               list(bounds))
    return dx, dcb, dxs_x, dys_ys, dy_x


def scan_factors(raw: Tensor, dt_bias: Tensor, A: Tensor,
                 factored_range: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Both directions' step sizes ``dt = softplus(raw + dt_bias[r])`` (b, 2, h, L) from the
    token-major ``raw`` (b, L, h), and the quadratic scan's factors of them with ``A`` (2, h):
    ``S`` (float64), ``row``, ``col`` and ``wide`` as :class:`.ssd_quadratic.ScanState` holds
    them, in one pass per (sample, direction, head)."""
    dt, S, row, col, wide = _module().scan_factors(raw, dt_bias.contiguous(), A.contiguous(),
                                                   factored_range, True)
    return dt, S, row, col, wide


def scan_steps(raw: Tensor, dt_bias: Tensor) -> Tensor:
    """``dt`` of :func:`scan_factors` alone (the same values; the recurrence's step sizes)."""
    bias = dt_bias.contiguous()
    return _module().scan_factors(raw, bias, bias, 0., False)[0]


def column_products(a: Tensor, m: Tensor, bounds: list[int], transpose: bool,
                    prefix_first: bool) -> Tensor:
    """``a @ m`` (``transpose``: ``a @ m^T``) per (sample, direction, group) of the planes ``a``
    (b, R, g, P, L) and the matrices ``m`` (b, R, g, L, L), a new tensor like ``a``, per token
    block of ``bounds`` (:func:`.ssd_quadratic.block_bounds`), ``m`` taken as zero outside its
    block triangle (column block ``j`` reads its rows ``[0, j1)`` in direction 0 if
    ``prefix_first``, else in direction 1, and rows ``[j0, L)`` in the other). Every block
    product is one task of a single-threaded GEMM."""
    out = a.new_empty(a.shape)
    _module().column_products(a, m, out, list(bounds), transpose, prefix_first)
    return out


def masked_outer(dy: Tensor, x: Tensor, bounds: list[int]) -> tuple[Tensor, Tensor]:
    """``dy^T @ x`` (b, R, g, L, L) per (sample, direction, group) of the planes ``dy`` and
    ``x`` (b, R, g, P, L) on direction 0's strict lower and direction 1's strict upper
    triangle, zero elsewhere (its blocks off the triangle never computed), and the full
    product's diagonal (b, R, g, L)."""
    out = dy.new_empty(*dy.shape[:3], dy.shape[-1], dy.shape[-1])
    d = dy.new_empty(*dy.shape[:3], dy.shape[-1])
    _module().masked_outer(dy, x, out, list(bounds), d)
    return out, d


def rms_norm_forward(x: Tensor, weight: Tensor | None, eps: float) -> tuple[Tensor, Tensor]:
    """``y = x rstd weight`` and ``rstd = 1 / sqrt(mean(x^2) + eps)`` (..., 1) over the last
    dimension of the contiguous float32 / float64 ``x`` (the weight of its dtype, or None)."""
    y, rstd = _module().rms_norm_forward(x, weight, eps)
    return y, rstd


def rms_norm_backward(grad: Tensor, x: Tensor, rstd: Tensor,
                      weight: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """Gradients of :func:`rms_norm_forward` for the contiguous ``grad``: ``dx`` and
    ``dweight`` (None without a weight)."""
    grads = _module().rms_norm_backward(grad, x, rstd, weight)
    return grads[0], grads[1] if weight is not None else None


#: the head sizes (states, channels) of :func:`recurrent_scan_forward`
RECURRENT_HEADS = (16, 16)


def recurrent_fits(d_state: int, headdim: int) -> bool:
    """Whether :func:`recurrent_scan_forward` takes heads of ``headdim`` channels with
    ``d_state`` states."""
    return (d_state, headdim) == RECURRENT_HEADS


def recurrent_scan_forward(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                           D: Tensor | None) -> Tensor:
    """The SSD scan by its recurrence, for heads that :func:`recurrent_fits`: ``y`` (b, R, h, p,
    L), a new contiguous tensor, of the operands of :func:`.ssd_quadratic.scan_forward` in its
    layout (``x``, ``B``, ``C`` planes, ``dt`` (b, R, h, L), ``A`` and ``D`` (R, h));
    ``csrc/recurrent.h`` says how."""
    return _module().recurrent_scan_forward(x, dt, A.contiguous(), B, C,
                                            None if D is None else D.contiguous())


def recurrent_scan_backward(dy: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                            D: Tensor | None) -> tuple[Tensor, ...]:
    """Gradients of :func:`recurrent_scan_forward` for ``dy`` (like ``x``): ``dx``, ``ddt``,
    ``dA`` (R, h), ``dB``, ``dC`` and ``dD`` (R, h; zeros without ``D``)."""
    dx, ddt, dA, dB, dC, dD = _module().recurrent_scan_backward(
        dy, x, dt, A.contiguous(), B, C, None if D is None else D.contiguous())
    return dx, ddt, dA, dB, dC, dD


def chunk_scan_forward(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None,
                       chunk: int, keep_states: bool) -> tuple[Tensor, list[Tensor]]:
    """The chunked SSD scan (:func:`~mmdinomamba.ops.ssd_scan_chunked`'s arguments, contiguous,
    one float dtype) in chunks of ``chunk`` tokens: ``y`` (b, L, h, p) and, with
    ``keep_states``, the states entering the chunks that :func:`chunk_scan_backward` reads, in
    pieces of consecutive chunks (b, chunks of the piece, g, n, r*p) of at most 16 MiB each
    (else an empty list)."""
    y, states = _module().chunk_scan_forward(x, dt, A, B, C, D, chunk, keep_states)
    return y, states


def chunk_scan_backward(dy: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                        D: Tensor | None, states: Sequence[Tensor],
                        chunk: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients of :func:`chunk_scan_forward` for the contiguous ``dy``: ``dx``, ``ddt``,
    ``dA``, ``dB``, ``dC`` and ``dD`` (zeros without ``D``)."""
    dx, ddt, dA, dB, dC, dD = _module().chunk_scan_backward(dy, x, dt, A, B, C, D, list(states),
                                                            chunk)
    return dx, ddt, dA, dB, dC, dD
