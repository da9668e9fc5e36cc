"""The chunked SSD scan in plain PyTorch: the reference for long sequences, and the scan of
everything without a kernel (other devices, float16 / bfloat16 on CPU, inside
:func:`~mmdinomamba.ops.reference_ops`).

Mamba-2's block decomposition (Dao & Gu, section 6): the sequence is cut into chunks of ``Q``
tokens; per head, with ``a_t = dt_t A`` and ``seg(i, j) = a_{j+1} + ... + a_i`` inside a chunk,

* diagonal blocks: ``y_i = sum_{j<=i} (C_i . B_j) exp(seg(i, j)) dt_j x_j``;
* chunk states: ``S = sum_j exp(seg(Q, j)) dt_j B_j x_j^T`` (n, p);
* state passing: ``H_k = exp(seg(Q, 0)) H_{k-1} + S_k``, a loop over the chunks on (n, p)
  states (no (chunks x chunks) tensor);
* off-diagonal blocks: ``y_i += exp(seg(i, 0)) C_i H_{k-1}``;

and ``y += D x``. ``seg`` sums the ``a``'s of each pair (not a difference of cumulative sums,
which cancels for strong decays), and the upper triangle is masked to ``-inf`` before ``exp``:
no ``inf``, no NaN, and gradients keep their precision. Autograd differentiates it; a ragged
last chunk is padded with ``dt = 0`` tokens (no decay, no input), which changes nothing.

The native CPU kernel of the same decomposition is :mod:`mmdinomamba.ops.cpu.ssd_chunked`.
"""
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ['ssd_scan_chunked', 'PORTABLE_CHUNK_SIZE']

#: Chunk length of the chunked scans (this one and the native CPU kernel): this scan's fastest of
#: 32, 64 and 128 (forward + backward, 16 heads of 64, state 64, L = 1024 and 4096, one thread).
PORTABLE_CHUNK_SIZE = 32


def _segsum(a: Tensor) -> Tensor:
    """(..., Q) -> (..., Q, Q): ``seg[i, j] = a_{j+1} + ... + a_i`` for ``i >= j``, else -inf."""
    Q = a.shape[-1]
    pairs = torch.ones(Q, Q, dtype=torch.bool, device=a.device)
    seg = a[..., :, None].expand(*a.shape, Q).masked_fill(~pairs.tril(-1), 0).cumsum(dim=-2)
    return seg.masked_fill(~pairs.tril(), float('-inf'))


def _scan(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, Q: int) -> Tensor:
    """The decomposition above for a length that is a multiple of ``Q`` (without ``D``)."""
    b, length, h, p = x.shape
    g, n = B.shape[2:]
    r, c = h // g, length // Q
    xc = x.reshape(b, c, Q, g, r, p)
    Bc, Cc = B.reshape(b, c, Q, g, n), C.reshape(b, c, Q, g, n)
    dtc = dt.reshape(b, c, Q, g, r).permute(0, 1, 3, 4, 2)  # (b, c, g, r, Q)
    a = dtc * A.reshape(g, r, 1)
    decay = torch.exp(_segsum(a))  # (b, c, g, r, Q, Q)
    cb = torch.einsum('bcign,bcjgn->bcgij', Cc, Bc)[:, :, :, None]  # shared by a group's heads
    y = torch.einsum('bcgrij,bcjgrp->bcigrp', cb * decay * dtc[..., None, :], xc)

    to_end = (decay[..., -1, :] * dtc).permute(0, 1, 4, 2, 3)  # (b, c, Q, g, r)
    S = torch.einsum('bcjgn,bcjgrp->bcgrnp', Bc, xc * to_end[..., None])
    chunk_decay = torch.exp(a.sum(dim=-1))[..., None, None]  # (b, c, g, r, 1, 1)
    state, y_off = torch.zeros_like(S[:, 0]), []
    # unbind, not S[:, k]: one backward for all chunks instead of a full-size one per chunk
    for C_k, S_k, decay_k in zip(Cc.unbind(1), S.unbind(1), chunk_decay.unbind(1)):
        y_off.append(torch.einsum('bign,bgrnp->bigrp', C_k, state))
        state = state * decay_k + S_k
    from_start = torch.exp(a.cumsum(dim=-1)).permute(0, 1, 4, 2, 3)  # (b, c, Q, g, r)
    y_off = torch.stack(y_off, dim=1)
    return (y + y_off * from_start[..., None]).reshape(b, length, h, p)


def ssd_scan_chunked(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                     D: Tensor | None = None, chunk_size: int = PORTABLE_CHUNK_SIZE,
                     upcast: bool = True) -> Tensor:
    """Chunked SSD scan, exact to :func:`~mmdinomamba.ops.reference.ssd_scan_ref` up to
    floating-point rounding, for any length, device and floating dtype, with autograd.

    Args:
        x (Tensor): (batch, length, heads, headdim).
        dt (Tensor): (batch, length, heads) positive step sizes.
        A (Tensor): (heads,) negative decay rates.
        B (Tensor): (batch, length, groups, state); head ``i`` uses group
            ``i // (heads // groups)``.
        C (Tensor): (batch, length, groups, state).
        D (Tensor, optional): (heads,) skip weights. Defaults to None.
        chunk_size (int): tokens per chunk; the result does not depend on it beyond rounding.
            Defaults to :data:`PORTABLE_CHUNK_SIZE`.
        upcast (bool): compute float16 / bfloat16 inputs in float32 and cast the result back;
            False computes in the input dtype (a "plain PyTorch in bf16" baseline for kernel
            accuracy checks). Defaults to True.

    Returns:
        Tensor: (batch, length, heads, headdim), dtype of ``x``.
    """
    if chunk_size < 1:
        raise ValueError(f'chunk_size must be >= 1, got {chunk_size}')
    out_dtype, length = x.dtype, x.shape[1]
    dtype = torch.float32 if upcast and x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    Q = max(1, min(chunk_size, length))
    pad = -length % Q
    # autocast would run the products in bf16 / fp16: the scan computes in ``dtype`` only
    with torch.autocast(device_type=x.device.type, enabled=False):
        x, dt, A, B, C = (t.to(dtype) for t in (x, dt, A, B, C))
        xp, dtp, Bp, Cp = (F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) if pad else t
                           for t in (x, dt, B, C))
        y = _scan(xp, dtp, A, Bp, Cp, Q)[:, :length]
        if D is not None:
            y = y + x * D.to(dtype)[:, None]
    return y.to(out_dtype)
