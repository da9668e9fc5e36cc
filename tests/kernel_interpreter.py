"""Run the CUDA fast path on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``).

Imported by the scripts the ``run_interpreted`` fixture runs in a fresh process. ``route()``
sends CPU tensors down every dispatcher's kernel branch (``_triton.on_kernel_device``) with our
fused kernels (after their self-checks) and, when ``mamba_ssm`` is installed, its Triton SSD
scan and gated RMSNorm and our conv + scan function built on them. ``mamba_ssm``'s host code
asks CUDA for a device context, its SM count and autotuning timings; on CPU those three calls are
answered here (a null context, 2 SMs, the first autotuning config). The kernels themselves run
unchanged.
"""
import contextlib
import functools
import importlib.util
import os
import types

import torch

assert os.environ.get('TRITON_INTERPRET') == '1', 'run with TRITON_INTERPRET=1'


def _patch_cuda_host_calls() -> None:
    import triton.runtime.autotuner as autotuner
    torch.cuda.device = lambda index: contextlib.nullcontext()
    torch.cuda.get_device_properties = lambda device=None: types.SimpleNamespace(
        multi_processor_count=2)
    autotuner.Autotuner._bench = lambda self, *args, config=None, **kwargs: [0., 0., 0.]


def has_mamba_ssm() -> bool:
    return importlib.util.find_spec('mamba_ssm') is not None


def route_lazily(mamba: bool = True) -> None:
    """Route CPU tensors to the kernels as a GPU does: nothing is looked up or self-checked
    before the first call that needs it (the checks then run on CPU tensors). ``mamba``: also
    ``mamba_ssm``'s scan and norm and our conv + scan built on them (else the portable scan and
    norm)."""
    from mmdinomamba.ops.cuda import (_triton, bidir_conv_scan_triton, bidir_conv_triton,
                                      bidir_merge_triton)
    _patch_cuda_host_calls()
    for mod in (bidir_conv_triton, bidir_merge_triton, bidir_conv_scan_triton):
        if not isinstance(mod.self_check, functools.partial):
            mod.self_check = functools.partial(mod.self_check, device='cpu')
    _triton._cache.clear()
    _triton._cache['conv'] = None  # causal_conv1d: a CUDA build only
    if not mamba:
        _triton._cache.update(scan=None, norm=None, conv_scan=None)
    _triton.on_kernel_device = lambda x: True


def route_ops() -> None:
    """Route CPU tensors to the mixer's two ops (``mmdinomamba::bidir_conv_scan`` and
    ``mmdinomamba::bidir_gated_merge``) as on a GPU, without their self-checks (the caller
    compares with the reference itself)."""
    from mmdinomamba.ops.cuda import (_triton, bidir_conv_scan_triton, bidir_conv_triton,
                                      bidir_merge_triton)
    _patch_cuda_host_calls()
    _triton._cache.clear()
    _triton._cache.update(conv=None, norm=None, bidir_conv=bidir_conv_triton.bidir_causal_conv,
                          bidir_merge=bidir_merge_triton.bidir_gated_merge,
                          conv_scan=bidir_conv_scan_triton.bidir_conv_scan)
    _triton.on_kernel_device = lambda x: True


def route(mamba: bool = True) -> list:
    """Route CPU tensors to the kernels; returns the names of the kernels in use. ``mamba``:
    also ``mamba_ssm``'s scan and norm if installed (else the portable scan and norm)."""
    from mmdinomamba.ops.cuda import _triton, bidir_conv_triton, bidir_merge_triton
    _patch_cuda_host_calls()
    bidir_conv_triton.self_check(device='cpu')
    bidir_merge_triton.self_check(device='cpu')
    cache = dict(conv=None, bidir_conv=bidir_conv_triton.bidir_causal_conv,
                 bidir_merge=bidir_merge_triton.bidir_gated_merge, scan=None, norm=None,
                 conv_scan=None)
    _triton._cache.clear()
    _triton._cache.update(cache)
    _triton.on_kernel_device = lambda x: True
    if mamba and has_mamba_ssm():
        del _triton._cache['scan'], _triton._cache['norm']
        assert _triton.chunk_scan_fn() is not None and _triton.rmsnorm_fn() is not None
        from mmdinomamba.ops.cuda import bidir_conv_scan_triton
        bidir_conv_scan_triton.self_check(device='cpu')  # against the routed composition
        _triton._cache['conv_scan'] = bidir_conv_scan_triton.bidir_conv_scan
    return sorted(k for k, v in _triton._cache.items() if v is not None)


def count_calls(*keys) -> list:
    """Wrap the routed kernels ``keys`` (``_triton`` cache keys, after :func:`route`) so that
    each call appends its key to the returned list."""
    from mmdinomamba.ops.cuda import _triton
    calls = []

    def counted(key, fn):
        def wrapper(*args, **kwargs):
            calls.append(key)
            return fn(*args, **kwargs)
        return wrapper

    for key in keys:
        _triton._cache[key] = counted(key, _triton._cache[key])
    return calls
