"""Public SSD scan entry point: one signature, three implementations.

* ``'ref'``: the naive sequential recurrence (:func:`ssd_scan_ref`, tests only);
* ``'torch'``: the portable PyTorch scan, the CPU default: the quadratic form
  (:func:`ssd_scan_quadratic`) up to :func:`~mmdinomamba.ops.quadratic_max_len` tokens, the
  chunked scan (:func:`ssd_scan_chunked`, chunks of :data:`PORTABLE_CHUNK_SIZE`) beyond;
* ``'triton'``: ``mamba_ssm``'s ``mamba_chunk_scan_combined`` for CUDA tensors.

``'auto'`` picks Triton for CUDA tensors when ``mamba_ssm`` can be imported, else the portable
scan. A requested but unusable Triton backend degrades to the portable scan with a logged
note, never an error (see ``_triton.py``).
"""
from torch import Tensor

from . import _triton
from ._triton import chunk_scan_fn, log_once
from .ssd_chunked import PORTABLE_CHUNK_SIZE, ssd_scan_chunked
from .ssd_quadratic import ssd_scan_quadratic
from .ssd_ref import check_ssd_shapes, ssd_scan_ref
from .variants import quadratic_max_len

__all__ = ['ssd_scan', 'PORTABLE_CHUNK_SIZE', 'SSD_BACKENDS']

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
        chunk_size (int): chunk length of the Triton kernel (the portable scans choose their
            own blocks; the result does not depend on them beyond rounding). Defaults to 256.
        backend (str): ``'auto'``, ``'torch'``, ``'triton'`` or ``'ref'``. Defaults to 'auto'.

    Returns:
        Tensor: (batch, length, heads, headdim) in the dtype of ``x``.
    """
    if backend not in SSD_BACKENDS:
        raise ValueError(f'backend must be one of {SSD_BACKENDS}, got {backend!r}')
    check_ssd_shapes(x, dt, A, B, C, D)
    if backend == 'ref':
        return ssd_scan_ref(x, dt, A, B, C, D)
    if backend != 'torch' and _kernel_applies(x, backend) and (y := _triton.run_kernel(
            'scan', chunk_scan_fn, 'mamba_chunk_scan_combined', x, dt, A, B, C, chunk_size,
            D=D)) is not None:
        return y
    if x.shape[1] <= quadratic_max_len(x.shape[-1], B.shape[-1]):
        return ssd_scan_quadratic(x, dt, A, B, C, D)
    return ssd_scan_chunked(x, dt, A, B, C, D, chunk_size=PORTABLE_CHUNK_SIZE)


def _kernel_applies(x: Tensor, backend: str) -> bool:
    """Whether the Triton kernel applies to ``x`` (with a note if it was asked for and does
    not)."""
    if _triton.on_kernel_device(x):
        return True
    if backend == 'triton':
        log_once('triton-cpu', "backend='triton' needs CUDA tensors; using the portable PyTorch "
                 'scan')
    return False
