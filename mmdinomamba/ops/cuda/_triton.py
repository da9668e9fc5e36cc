"""The one place where optional CUDA kernels are imported (lazily, guarded, decided once).

Kernels (each looked up on first CUDA use, never at package import):

* ``mamba_chunk_scan_combined`` (SSD scan) and ``rmsnorm_fn`` (gated RMSNorm), the Triton
  kernels of ``mamba_ssm`` (``mamba_ssm/ops/triton/ssd_combined.py``, ``layernorm_gated.py``);
* ``causal_conv1d_fn`` from the ``causal_conv1d`` package (CUDA build only);
* ``bidir_causal_conv``, our own Triton kernel of both directions' causal conv + SiLU
  (``bidir_conv_triton.py``), and ``bidir_gated_merge``, our kernel of the output side (un-flip,
  two gated RMSNorms, average; ``bidir_merge_triton.py``), each used after a one-off self-check
  against the reference;
* ``bidir_conv_scan``: our conv kernel and ``mamba_ssm``'s SSD forward / backward as one op that
  recomputes the conv in the backward pass (``bidir_conv_scan_triton.py``), after a self-check
  against the composition.

How ``mamba_ssm`` is reached: ``mamba_ssm==2.3.2.post1`` installed without its CUDA build (the
pure-Python wheel, ``MAMBA_SKIP_CUDA_BUILD=TRUE``) cannot be imported as a package, because
its ``__init__.py`` eagerly imports ``selective_scan_cuda`` (a compiled extension that does not
exist) and ``transformers`` (through ``utils/generation.py``). The Triton kernel files need
neither. We therefore first try the normal import; if the package's ``__init__`` fails, we
register a bare package object for ``mamba_ssm`` (its ``__path__`` pointing at the installed
files, its ``__init__.py`` not executed) in ``sys.modules`` and import the kernel modules
through it. We do NOT insert a fake ``selective_scan_cuda`` module: the bare package is only
created when the real package cannot be imported at all, so it hides nothing that worked.

Whether a kernel is usable is decided once, on its first lookup (never inside a CUDA graph
capture: that raises; warm up one step first, the lookup imports, compiles and self-checks):
any failure then (no CUDA, no Triton, no ``mamba_ssm``, an import error, a failed self-check)
is one warning naming the reason, and the caller runs the reference from then on. Inside
:func:`~mmdinomamba.ops.reference_ops` every lookup reports None. The mixer's two
``torch.library`` ops are reached through :func:`kernel` (traced by ``torch.compile``, the
decision a constant: no graph break), the library kernels through :func:`run_kernel` (opaque
to ``torch.compile``); both raise what a kernel raises at run time. :func:`on_kernel_device` is
the one test of whether a tensor takes the kernel branch.
"""
import importlib
import importlib.util
import sys
import types
import warnings
from typing import Any, Callable

import torch

from ..self_check import mismatch, reference_graph
from ..switch import kernels_enabled

_SSD_MODULE = 'mamba_ssm.ops.triton.ssd_combined'
_NORM_MODULE = 'mamba_ssm.ops.triton.layernorm_gated'
_cache: dict = {}
_logged: set = set()


def on_kernel_device(x) -> bool:
    """Whether ``x`` lives where the optional kernels run: CUDA. Every dispatcher asks this one
    function, so the tests can send CPU tensors down the kernel path under Triton's CPU
    interpreter (``TRITON_INTERPRET=1``) by replacing it."""
    return x.is_cuda


def log_once(key: str, msg: str) -> None:
    """Log ``msg`` through mmengine's current logger the first time ``key`` is seen."""
    if key in _logged:
        return
    _logged.add(key)
    from mmengine.logging import print_log
    print_log(f'mmdinomamba.ops: {msg}', logger='current')


def import_mamba_module(name: str) -> types.ModuleType:
    """Import a ``mamba_ssm`` submodule, bypassing a broken ``mamba_ssm/__init__.py``."""
    if importlib.util.find_spec('mamba_ssm') is None:
        raise ImportError('mamba_ssm is not installed')
    try:
        return importlib.import_module(name)
    except ImportError as err:
        if name in sys.modules:  # imported completely before the package __init__ failed
            return sys.modules[name]
        if 'mamba_ssm' in sys.modules:
            raise  # the package imported; the kernel module itself is broken
        spec = importlib.util.find_spec('mamba_ssm')
        pkg = types.ModuleType('mamba_ssm', doc='bare package (mmdinomamba.ops._triton)')
        pkg.__path__ = list(spec.submodule_search_locations or [])
        pkg.__spec__, pkg.__file__ = spec, spec.origin
        sys.modules['mamba_ssm'] = pkg
        log_once(
            'bare', f'`import mamba_ssm` failed ({err}); loading its Triton kernel '
            'files without the package __init__')
        return importlib.import_module(name)


@torch.compiler.disable
def _lookup(key: str, module: str, attr: str, what: str,
            self_check: bool = False) -> Callable | None:
    """Find ``module.attr`` once (cached); log which implementation is used. With
    ``self_check``, ``module.self_check()`` must pass first (it compiles and runs the kernel
    once on a small input, so a kernel that fails to build degrades here, not mid-training).
    Never traced by ``torch.compile`` (compiled code reaches it through :func:`kernel`, which
    runs it outside the trace, or :func:`run_kernel`)."""
    if not kernels_enabled():
        return None
    if key not in _cache:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f'{what}: first used inside a CUDA graph capture; run one step '
                               'before capturing (the first use imports and self-checks)')
        try:
            if module.startswith('mamba_ssm'):
                importlib.import_module('triton')
                fn = getattr(import_mamba_module(module), attr)
            else:
                mod = importlib.import_module(module)
                if self_check:
                    mod.self_check()
                fn = getattr(mod, attr)
            log_once(key, f'{what}: using {module}.{attr} for CUDA tensors')
        except Exception as err:  # decided once: the reference runs from now on
            fn = None
            warnings.warn(f'mmdinomamba.ops: {what}: {module}.{attr} unavailable '
                          f'({type(err).__name__}: {err}); using the PyTorch reference')
        _cache[key] = fn
    return _cache[key]


def compare_with_reference(what: str, kernel: Callable, reference: Callable, inputs: list,
                           grad_out, names: tuple, tol: float) -> None:
    """A kernel's self-check: run ``kernel`` and ``reference`` on fresh leaf copies of ``inputs``
    (under :func:`~mmdinomamba.ops.self_check.reference_graph`: the first CUDA call, which
    triggers the check, may come from a no-grad DINO teacher, a bf16 autocast forward or an
    activation checkpoint), backpropagate ``grad_out`` and raise if the output or a gradient
    (``names``, in order) differs by more than ``tol`` relative error."""
    results = []
    with reference_graph(inputs[0].device.type):
        for fn in (kernel, reference):
            leaves = [t.clone().requires_grad_() for t in inputs]
            out = fn(*leaves)
            results.append([out.detach(), *torch.autograd.grad(out, leaves, grad_out)])
    error = mismatch(names, *results, tol)
    if error is not None:
        raise RuntimeError(f'{what} self-check: {error}')


@torch.compiler.disable
def run_kernel(key: str, lookup: Callable[[], Callable | None], what: str, *args,
               **kwargs) -> Any | None:
    """``lookup()(*args, **kwargs)``, or None when the kernel is unavailable (decided once, on
    its first lookup, with a warning). An error inside the kernel is raised, never
    swallowed. Opaque to ``torch.compile``: tracing into ``mamba_ssm``'s host code or our
    self-checks is neither useful nor safe."""
    fn = lookup()
    return None if fn is None else fn(*args, **kwargs)


@torch.compiler.assume_constant_result
def _usable(key: str) -> bool:
    return (conv_scan_fn if key == 'conv_scan' else bidir_merge_fn)() is not None


def kernel(key: str) -> Callable | None:
    """Our op ``key`` (``'conv_scan'`` or ``'bidir_merge'``) if it is usable now, else None.
    ``torch.compile`` traces this: the lookup runs once, outside the trace, its outcome a
    constant, and calling the op adds one node to the graph (no graph break)."""
    return _cache[key] if kernels_enabled() and _usable(key) else None


def fitted_chunk(seqlen: int, chunk_size: int) -> int:
    """The chunk length for ``mamba_ssm``'s scan: ``chunk_size``, or for a sequence that fits in
    one chunk the smallest power of two >= max(seqlen, 16) (its kernels pad every chunk to the
    full length; 16 is the smallest tile of their matrix products)."""
    return chunk_size if seqlen > chunk_size else max(16, 1 << (seqlen - 1).bit_length())


def chunk_scan_fn() -> Callable | None:
    """``mamba_ssm``'s ``mamba_chunk_scan_combined``, or None if it cannot be used."""
    return _lookup('scan', _SSD_MODULE, 'mamba_chunk_scan_combined', 'SSD scan')


def rmsnorm_fn() -> Callable | None:
    """``mamba_ssm``'s gated ``rmsnorm_fn`` (Triton), or None."""
    return _lookup('norm', _NORM_MODULE, 'rmsnorm_fn', 'gated RMSNorm')


def causal_conv1d_fn() -> Callable | None:
    """``causal_conv1d.causal_conv1d_fn`` (CUDA extension), or None."""
    return _lookup('conv', 'causal_conv1d', 'causal_conv1d_fn', 'causal conv1d')


def bidir_conv_fn() -> Callable | None:
    """Our fused Triton kernel of both directions' causal conv + SiLU (after a self-check
    against the reference), or None."""
    return _lookup('bidir_conv', 'mmdinomamba.ops.cuda.bidir_conv_triton', 'bidir_causal_conv',
                   'bidirectional causal conv', self_check=True)


def bidir_merge_fn() -> Callable | None:
    """Our fused Triton kernel of both directions' gated RMSNorm + average (after a
    self-check against the reference), or None."""
    return _lookup('bidir_merge', 'mmdinomamba.ops.cuda.bidir_merge_triton', 'bidir_gated_merge',
                   'bidirectional gated merge', self_check=True)


def conv_scan_fn() -> Callable | None:
    """Both directions' conv + SSD scan as one op that recomputes the conv
    (our conv kernel and ``mamba_ssm``'s scan, after a self-check), or None."""
    if bidir_conv_fn() is None or chunk_scan_fn() is None:
        return None
    return _lookup('conv_scan', 'mmdinomamba.ops.cuda.bidir_conv_scan_triton', 'bidir_conv_scan',
                   'fused conv + scan with conv recomputation', self_check=True)
