"""Public SSD scan entry point: one signature, three implementations.

* ``'ref'``: the naive sequential recurrence (:func:`ssd_scan_ref`, tests only);
* ``'torch'``: the portable PyTorch scan, the CPU default: the quadratic form
  (:func:`ssd_scan_quadratic`) where :func:`use_quadratic_form` says it pays (up to
  :func:`~mmdinomamba.ops.quadratic_max_len` tokens, few strongly decaying heads), else the
  chunked scan (:func:`ssd_scan_chunked`, chunks of :data:`PORTABLE_CHUNK_SIZE`);
* ``'triton'``: ``mamba_ssm``'s ``mamba_chunk_scan_combined`` for CUDA tensors.

``'auto'`` picks Triton for CUDA tensors when ``mamba_ssm`` can be imported, else the portable
scan. A requested but unusable Triton backend degrades to the portable scan with a logged
note, never an error (see ``_triton.py``).
"""
import torch
from torch import Tensor

from . import _triton
from ._triton import chunk_scan_fn, log_once
from .ssd_chunked import PORTABLE_CHUNK_SIZE, ssd_scan_chunked
from .ssd_quadratic import FACTORED_RANGE, ssd_scan_quadratic
from .ssd_ref import check_ssd_shapes, ssd_scan_ref
from .variants import quadratic_max_len

__all__ = ['ssd_scan', 'use_quadratic_form', 'quadratic_form_by_length', 'PORTABLE_CHUNK_SIZE',
           'SSD_BACKENDS', 'WIDE_TOKENS']

SSD_BACKENDS = ('auto', 'torch', 'triton', 'ref')

#: The quadratic form computes the (sample, head) pairs whose decay over the sequence exceeds
#: ``FACTORED_RANGE`` one by one, at several times the cost of the others, and its cost per pair
#: grows with the length; it is used while (share of such pairs) x (tokens) stays at most this.
#: Measured on a BiSSD layer, forward + backward, 2 threads (docs/results.md): the chunked scan
#: is as fast at a share of about 0.25 at 197 tokens (DinoVim-T), 0.1 at 401 and 0.6-0.7 at 65
#: (demo size), and 10-30% faster at twice that share. It runs as separate ops that keep more
#: activations (about 60 MB more for one DinoVim-T layer at batch 8), so the switch comes at
#: about twice the crossover: 96 (a share of 0.49 at 197 tokens, 0.24 at 401).
WIDE_TOKENS = 96


def quadratic_form_by_length(length: int, headdim: int, d_state: int) -> bool | None:
    """:func:`use_quadratic_form`'s answer where the length alone decides it (None where the
    step sizes must be looked at): False above :func:`~mmdinomamba.ops.quadratic_max_len`,
    True at most ``WIDE_TOKENS`` tokens (a share of at most 1 cannot exceed the bound)."""
    if length > quadratic_max_len(headdim, d_state):
        return False
    if length <= WIDE_TOKENS:
        return True
    return None


def use_quadratic_form(dt: Tensor, A: Tensor, headdim: int, d_state: int) -> bool:
    """Whether the portable scan of step sizes ``dt`` (batch, length, heads) (softplus
    applied) and decay rates ``A`` (heads,) takes the quadratic form: at most
    :func:`~mmdinomamba.ops.quadratic_max_len` tokens, and a share of strongly decaying
    (sample, head) pairs of at most ``WIDE_TOKENS / length``. Both forms are exact; this only
    picks the faster one."""
    length = dt.shape[1]
    if (by_length := quadratic_form_by_length(length, headdim, d_state)) is not None:
        return by_length
    with torch.no_grad():
        wide = (dt * A).sum(1).abs() > FACTORED_RANGE
        return wide.float().mean().item() * length <= WIDE_TOKENS


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
    if use_quadratic_form(dt, A, x.shape[-1], B.shape[-1]):
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
