"""Public SSD scan entry point: one signature, one reference, a kernel per device.

* ``'ref'``: the sequential recurrence (:func:`~mmdinomamba.ops.reference.ssd_scan_ref`, the
  specification; tests only);
* CUDA (``'auto'`` or ``'triton'``): ``mamba_ssm``'s ``mamba_chunk_scan_combined``;
* CPU (``'auto'`` or ``'torch'``), float32 / float64, with the native kernels: the native chunked
  scan (:func:`~mmdinomamba.ops.cpu.ssd_chunked.ssd_scan_chunked_native`);
* everything else, and everything inside :func:`~mmdinomamba.ops.reference_ops`: the chunked
  scan in PyTorch (:func:`~mmdinomamba.ops.reference.ssd_scan_chunked`).

The kernel is chosen by device and dtype alone (no look at the data, so no host sync).
"""
import torch
from torch import Tensor

from .cpu import native_cpu
from .cpu.ssd_chunked import ssd_scan_chunked_native
from .cuda import _triton
from .reference.ssd_chunked import PORTABLE_CHUNK_SIZE, ssd_scan_chunked
from .reference.ssd_ref import check_ssd_shapes, ssd_scan_ref

__all__ = ['ssd_scan', 'SSD_BACKENDS']

SSD_BACKENDS = ('auto', 'torch', 'triton', 'ref')

def ssd_scan(x: Tensor,
             dt: Tensor,
             A: Tensor,
             B: Tensor,
             C: Tensor,
             D: Tensor | None = None,
             chunk_size: int = 256,
             backend: str = 'auto') -> Tensor:
    """Mamba-2 SSD scan ``h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t^T, y_t = C_t h_t + D x_t``.

    Args:
        x (Tensor): (batch, length, heads, headdim).
        dt (Tensor): (batch, length, heads) positive step sizes (softplus and bias applied).
        A (Tensor): (heads,) negative decay rates.
        B (Tensor): (batch, length, groups, state); head ``i`` uses group
            ``i // (heads // groups)``.
        C (Tensor): (batch, length, groups, state).
        D (Tensor, optional): (heads,) skip weights. Defaults to None.
        chunk_size (int): chunk length of the Triton kernel, fitted to shorter sequences
            (:func:`~mmdinomamba.ops.cuda._triton.fitted_chunk`; the CPU scans choose their own
            blocks; the result does not depend on them beyond rounding). Defaults to 256.
        backend (str): ``'auto'``, ``'torch'`` (no ``mamba_ssm``), ``'triton'`` or ``'ref'``.
            Defaults to 'auto'.

    Returns:
        Tensor: (batch, length, heads, headdim) in the dtype of ``x``.
    """
    if backend not in SSD_BACKENDS:
        raise ValueError(f'backend must be one of {SSD_BACKENDS}, got {backend!r}')
    check_ssd_shapes(x, dt, A, B, C, D)
    if backend == 'ref':
        return ssd_scan_ref(x, dt, A, B, C, D)
    if backend != 'torch' and _triton.on_kernel_device(x) and (y := _triton.run_kernel(
            'scan', _triton.chunk_scan_fn, 'mamba_chunk_scan_combined', x, dt, A, B, C,
            _triton.fitted_chunk(x.shape[1], chunk_size), D=D)) is not None:
        return y
    if backend != 'triton' and x.dtype in (torch.float32, torch.float64) and native_cpu.use_for(x):
        args = [None if t is None else t.to(x.dtype) for t in (x, dt, A, B, C, D)]
        return ssd_scan_chunked_native(*args, chunk_size=PORTABLE_CHUNK_SIZE)
    return ssd_scan_chunked(x, dt, A, B, C, D, chunk_size=PORTABLE_CHUNK_SIZE)
