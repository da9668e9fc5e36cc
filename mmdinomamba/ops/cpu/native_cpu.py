"""The loader of the native CPU kernels (``csrc/*.cpp``) and thin typed wrappers of them.

The kernels do the bidirectional mixer's element-wise work (both directions' conv + SiLU, the
gated merge), the quadratic SSD scan's products and strongly decaying heads, the recurrence for
small heads, the chunked scan, the blocks' RMSNorm and the token-/channel-major copies, each in
one or two passes over cache-sized tiles (``at::parallel_for`` on torch's threads).

They are built once per machine and source version with ``torch.utils.cpp_extension`` (g++ and
ninja; ``-march=native``, the build keyed by the CPU's instruction-set flags and the sources'
paths and contents) into PyTorch's extension cache (``TORCH_EXTENSIONS_DIR``); a line is printed
before a build starts. After loading, the registered self-checks compare them once with the
PyTorch ops. If the build or a self-check fails, ONE warning names the reason and the
reference runs instead; nothing is retried or switched during a run. ``-ffast-math`` is a
compile flag only: the library is linked without it, so loading it does not switch the process
to flushing subnormal floats to zero (tested).
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

__all__ = ['SOURCES', 'load', 'available', 'use_for', 'load_error',
           'conv_silu_forward', 'conv_silu_backward', 'merge_forward', 'merge_backward',
           'column_products', 'masked_outer', 'rms_norm_forward', 'rms_norm_backward',
           'wide_weights', 'wide_grads', 'planes_fit', 'scale_tokens', 'scan_output',
           'scan_backward_pointwise', 'transpose_into', 'tokens_fit', 'scan_factors',
           'chunk_scan_forward', 'chunk_scan_backward']

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


#: Largest relative error (norm) of any result of a self-check (the kernels and the PyTorch ops
#: differ by about 1e-6 at most: other rounding orders)
SELF_CHECK_TOL = 1e-5

#: The self-checks run once the kernels are loaded: functions returning what differs by more
#: than ``SELF_CHECK_TOL`` (or None), registered by the modules whose kernels they compare
#: with the PyTorch ops (this module imports none of them)
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
    """``silu`` of :func:`~mmdinomamba.ops.shift_conv.bidir_conv_forward` of
    ``pad_channel_major(x)``: (b, 2, C, L) from the token-major ``x`` (b, L, C) (unit channel
    stride; a view into the projection is fine, :func:`tokens_fit`), ``weight`` (2, C, K) and
    ``bias`` (2, C) of ``x``'s dtype (float32 or float64, K from 2 to 4)."""
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
    groups of channels (:func:`~mmdinomamba.ops.bidir_inner.merge_forward` with a weight),
    written into the token-major ``out`` (b, L, d), which is returned. ``z`` and ``out`` need
    unit channel stride (views into wider tensors are fine, see :func:`tokens_fit`)."""
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
    ``x`` (b, 2, h, p, L) as :func:`planes_fit` says, ``row``, ``diag`` (b, 2, h, L)) plus, at
    the heads ``wide`` (b, 2, h) marks, their ``parts`` (N, p, L) in :func:`wide_forward`'s
    order (:meth:`.ssd_quadratic.ScanState.output`), rebuilt tile by tile inside the kernel
    instead of read: the same gradients and ``out`` without ``y`` in memory. Returns ``dy``
    (b, 2, h p, L) and ``dweight`` (2, h p)."""
    dy, dweight = _module().merge_backward_scan(dm, ys, row.contiguous(), x, diag.contiguous(),
                                                wide.contiguous(), parts, z,
                                                weight.contiguous(), groups, eps, dz, out)
    return dy, dweight


def tokens_fit(dtype: torch.dtype, *tensors: Tensor) -> bool:
    """Whether (b, L, d) tensors suit the native kernels as token-major operands: ``dtype``
    (float32 or float64), unit channel stride, tokens and samples apart."""
    return dtype in (torch.float32, torch.float64) and all(
        t.dtype == dtype and t.dim() == 3 and t.stride(2) == 1 and t.stride(1) >= t.shape[2]
        and (t.shape[0] == 1 or t.stride(0) >= t.shape[1] * t.stride(1)) for t in tensors)


def wide_weights(hi: Tensor, cb: Tensor, index: Tensor, direction: int,
                 transpose: bool) -> Tensor:
    """The weights ``W_ij = exp(clamp(hi_i - hi_j, -60, 0)) cb_ij`` (N, L, L) of N strongly
    decaying heads of the SSD scan (:mod:`.ssd_quadratic_heads`) on the ``direction``'s strict
    triangle (0: lower, 1: upper), zero elsewhere, or their transposes: ``hi`` (N, L) the heads'
    cumulative decay, ``cb`` (M, L, L) the group matrices, ``index`` (N,) sorted int64, head
    ``n``'s matrix ``cb[index[n]]``."""
    return _module().wide_weights(hi, cb, index, direction, transpose)


def wide_grads(dW: Tensor, hi: Tensor, t: Tensor, cb: Tensor, index: Tensor, direction: int,
               dcb: Tensor) -> tuple[Tensor, Tensor]:
    """Gradients of :func:`wide_weights` for ``dW`` (N, L, L): adds ``E * dW`` (``E`` the decay
    factors, on the triangle) to ``dcb[index[n]]`` in place and returns, with ``G = dW * W``,
    ``dS`` (N, L) = row sums minus column sums of ``G`` and ``sum_ij G_ij (t_i - t_j)`` (N,)
    in float64 (``t`` (N, L) like ``hi``)."""
    dS, pairs = _module().wide_grads(dW, hi, t, cb, index, direction, dcb)
    return dS, pairs


def wide_forward(x: Tensor, dt: Tensor, S: Tensor, cb: Tensor, wide: Tensor,
                 bounds: list[int], y: Tensor) -> Tensor:
    """:func:`.ssd_quadratic_heads.add_forward` in one call: adds the ``wide`` (b, R, h) heads'
    share of the quadratic scan to ``y`` in place and returns it (N, p, L) in the order of
    :func:`.ssd_quadratic_heads.add_saved`; ``x``, ``y`` (b, R, h, p, L) as :func:`planes_fit`
    says, ``dt`` (b, R, h, L) and ``S`` (float64) contiguous, ``cb`` (b, R, g, L, L) contiguous,
    the products per token block of ``bounds``."""
    return _module().wide_forward(x, dt, S, cb, wide, list(bounds), y)


def wide_backward(dy: Tensor, x: Tensor, dt: Tensor, S: Tensor, cb: Tensor, wide: Tensor,
                  bounds: list[int], dx: Tensor, ddt: Tensor, dS: Tensor,
                  dcb: Tensor) -> Tensor:
    """:func:`.ssd_quadratic_heads.add_backward` in one call: adds the ``wide`` heads' gradients
    to ``dx`` (like ``x``), ``ddt``, ``dS`` (like ``dt``, contiguous) and ``dcb`` (like ``cb``)
    in place and returns their ``dA`` (R, h) in float64 (operands as :func:`wide_forward`)."""
    return _module().wide_backward(dy, x, dt, S, cb, wide, list(bounds), dx, ddt, dS, dcb)


def products_forward(x: Tensor, s: Tensor, cb: Tensor, row: Tensor, diag: Tensor,
                     bounds: list[int]) -> tuple[Tensor, Tensor]:
    """The quadratic form's factored products with their element-wise work, per (sample,
    direction, group) in one pass: ``ys = xs @ cb^T`` per group (``xs = x s``, the heads of
    a group side by side) and ``y = ys row + x diag``, both (b, R, h, p, L) and contiguous;
    ``x`` as :func:`planes_fit` says, ``s``, ``row``, ``diag`` (b, R, h, L) and ``cb`` (b, R, g,
    L, L) contiguous, the products per token block of ``bounds`` (:mod:`.ssd_triangles`)."""
    ys, y = _module().products_forward(x, s, cb, row, diag, list(bounds))
    return ys, y


def products_backward(dy: Tensor, x: Tensor, ys: Tensor, s: Tensor, row: Tensor,
                      diag: Tensor, cb: Tensor, bounds: list[int]) -> tuple[Tensor, ...]:
    """Gradients of :func:`products_forward`'s products for ``dy`` (like ``x``): ``dx = dxs s +
    dy diag`` (``dxs = dys @ cb`` per group, ``dys = dy row``), ``dcb = dys^T @ xs`` on each
    direction's strict triangle (zero elsewhere), and the per-token sums over ``p`` of ``dxs
    x``, ``dys ys`` and ``dy x`` (b, R, h, L), as :func:`scan_backward_pointwise` gives them."""
    dx, dcb, dxs_x, dys_ys, dy_x = _module().products_backward(dy, x, ys, s, row, diag, cb,
                                                               list(bounds))
    return dx, dcb, dxs_x, dys_ys, dy_x


def transpose_into(dst: Tensor, src: Tensor, native: bool = True) -> Tensor:
    """``dst.copy_(src.transpose(1, 2))`` for 3-d ``dst`` (b, m, n) and ``src`` (b, n, m), and
    returns ``dst``; with ``native`` (the caller's :func:`use_for`) in the native kernel when
    both have ``dst``'s floating dtype and unit stride in their last dimension (views into wider
    tensors are fine), else by PyTorch's copy (other dtypes are converted there)."""
    if (native and dst.dtype == src.dtype and dst.dtype in (torch.float32, torch.float64)
            and dst.stride(-1) == 1 and src.stride(-1) == 1
            and dst.stride(1) >= dst.shape[2] and src.stride(1) >= src.shape[2]):
        _module().transpose_into(dst, src)
        return dst
    return dst.copy_(src.transpose(1, 2))


def planes_fit(*tensors: Tensor) -> bool:
    """Whether (b, R, h, p, L) tensors suit the scan's element-wise kernels: float32 / float64,
    one dtype, contiguous (p, L) planes (any strides outside them)."""
    dtype = tensors[0].dtype
    return dtype in (torch.float32, torch.float64) and all(
        t.dtype == dtype and t.dim() == 5 and t.stride(-1) == 1 and t.stride(-2) == t.shape[-1]
        for t in tensors)


def fused_fit(planes: list[Tensor], flat: list[Tensor]) -> bool:
    """Whether operands suit the scan's fused kernels (:func:`products_forward`,
    :func:`wide_forward` and their backward passes): (b, R, h, p, L) ``planes`` as
    :func:`planes_fit` says and contiguous ``flat`` tensors of their dtype."""
    return planes_fit(*planes) and all(t.is_contiguous() and t.dtype == planes[0].dtype
                                       for t in flat)


def scan_factors(raw: Tensor, dt_bias: Tensor, A: Tensor,
                 factored_range: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Both directions' step sizes ``dt = softplus(raw + dt_bias[r])`` (b, 2, h, L) from the
    token-major ``raw`` (b, L, h) (:func:`tokens_fit`; a view into the projection is fine), and
    the quadratic scan's factors of them with ``A`` (2, h): ``S`` (float64), ``row``, ``col``
    and ``wide`` as :func:`~mmdinomamba.ops.ssd_quadratic.ScanState` holds them, in one pass per
    (sample, direction, head)."""
    dt, S, row, col, wide = _module().scan_factors(raw, dt_bias.contiguous(), A.contiguous(),
                                                   factored_range, True)
    return dt, S, row, col, wide


def scan_steps(raw: Tensor, dt_bias: Tensor) -> Tensor:
    """``dt`` of :func:`scan_factors` alone (the same values; the recurrence's step sizes)."""
    bias = dt_bias.contiguous()
    return _module().scan_factors(raw, bias, bias, 0., False)[0]


def column_products(a: Tensor, m: Tensor, bounds: list[int], transpose: bool,
                    prefix_first: bool, out: Tensor | None = None) -> Tensor:
    """``a @ m`` (``transpose``: ``a @ m^T``) per (sample, direction, group) of ``a`` (b, R, g,
    P, L) and the matrices ``m`` (b, R, g, L, L), written into ``out`` (like ``a``; a new
    tensor if None) and returned: the products of :mod:`.ssd_triangles` with the token
    ``bounds`` of its blocks, the product ``m`` taken as zero outside its block triangle
    (column block ``j`` reads its rows ``[0, j1)`` in direction 0 if ``prefix_first``, else in
    direction 1, and rows ``[j0, L)`` in the other). Every block product is one task of a
    single-threaded GEMM; operands as :func:`planes_fit` says (``out`` may be a view with unit
    stride along L)."""
    out = a.new_empty(a.shape) if out is None else out
    _module().column_products(a, m, out, list(bounds), transpose, prefix_first)
    return out


def masked_outer(dy: Tensor, x: Tensor, bounds: list[int], diag: bool = False,
                 first_lower: bool = True) -> tuple[Tensor, Tensor | None]:
    """``dy^T @ x`` (b, R, g, L, L) per (sample, direction, group) of ``dy`` and ``x`` (b, R,
    g, P, L) on direction 0's strict lower and direction 1's strict upper triangle (the other
    way round unless ``first_lower``), zero elsewhere (its blocks off the triangle never
    computed), and with ``diag`` the full product's diagonal (b, R, g, L) (else None)."""
    out = dy.new_empty(*dy.shape[:3], dy.shape[-1], dy.shape[-1])
    d = dy.new_empty(*dy.shape[:3], dy.shape[-1]) if diag else None
    _module().masked_outer(dy, x, out, list(bounds), d, first_lower)
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


def scale_tokens(x: Tensor, s: Tensor) -> Tensor:
    """``x * s.unsqueeze(-2)`` of ``x`` (b, R, h, p, L) (:func:`planes_fit`) and the per-token
    ``s`` (b, R, h, L), a new contiguous tensor."""
    return _module().scale_tokens(x, s.contiguous())


def scan_output(ys: Tensor, row: Tensor, x: Tensor, diag: Tensor) -> Tensor:
    """``ys * row.unsqueeze(-2) + x * diag.unsqueeze(-2)`` (the quadratic SSD scan's output
    from its product ``ys``), a new contiguous tensor; shapes as in :func:`scale_tokens`."""
    return _module().scan_output(ys, row.contiguous(), x, diag.contiguous())


def scan_backward_pointwise(dxs: Tensor, x: Tensor, dy: Tensor, dys: Tensor, ys: Tensor,
                            s: Tensor, diag: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The quadratic SSD scan's backward element-wise work in one pass: writes ``dxs * s + dy *
    diag`` (per-token ``s`` and ``diag``) over the contiguous ``dxs`` and returns the per-token
    sums over the channels ``p`` of ``dxs * x``, ``dys * ys`` and ``dy * x`` (b, R, h, L)."""
    dxs_x, dys_ys, dy_x = _module().scan_backward_pointwise(dxs, x, dy, dys, ys, s.contiguous(),
                                                           diag.contiguous())
    return dxs_x, dys_ys, dy_x


#: the head sizes (states, channels) of :func:`recurrent_scan_forward`
RECURRENT_HEADS = (16, 16)


def recurrent_fits(d_state: int, headdim: int) -> bool:
    """Whether :func:`recurrent_scan_forward` takes heads of ``headdim`` channels with
    ``d_state`` states."""
    return (d_state, headdim) == RECURRENT_HEADS


def recurrent_scan_forward(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                           D: Tensor | None) -> Tensor:
    """The SSD scan by its recurrence, for heads that :func:`recurrent_fits`: ``y`` (b, R, h, p,
    L), a new contiguous tensor, of the operands of
    :func:`~mmdinomamba.ops.ssd_quadratic.scan_forward` in its layout (``x``, ``B``, ``C`` as
    :func:`planes_fit` says, ``dt`` (b, R, h, L) contiguous, ``A`` and ``D`` (R, h))."""
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
