"""Functional core of the Mamba-like linear attention (MILA paper, arXiv:2405.16605).

One formula covers linear attention, Mamba's selective SSM and everything in between. Per head,
with kernelized queries/keys ``q, k`` (B, L, h, n), their position-rotated versions ``qr, kr``
(``= q, k`` without RoPE), values ``v`` (B, L, h, p), an optional per-token input gate
``Delta`` (B, L, h) and an optional per-token forget gate ``a_t = exp(dt_t A)``:

    S_i = a_i S_{i-1} + kr_i^T (Delta_i v_i)        Z_i = a_i Z_{i-1} + k_i^T
    y_i = qr_i S_i / (q_i Z_i)   (normalized)   or   y_i = qr_i S_i   (no normalization)

i.e. ``y = M v`` with ``M_ij = (qr_i . kr_j) decay_ij Delta_j / norm_i``. Without the forget
gate the sums run over all tokens (global, non-causal linear attention, computed in O(L n p) with
the ``K^T V`` trick); with it they are a Mamba-2 SSD scan (``ssd_scan``) with ``B = kr``,
``C = qr``: causal (``decay_ij = exp(sum_{t=j+1..i} dt_t A)`` for ``j <= i``) or bidirectional (a
forward plus a flipped backward scan, the diagonal counted once, so a decay of 1 gives global
attention back).

The normalizer follows MILA's code: ``norm_i = (q_i . sum_j decay_ij k_j) / L + eps`` with the
numerator also divided by ``L`` (equal to plain ``1 / sum`` normalization up to ``eps``); it uses
the un-rotated ``q, k`` and no input gate (the slides' ``Z_i = Z_{i-1} + K_i^T``).
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from mmdinomamba.ops import ssd_mixing_matrix, ssd_scan

__all__ = ['KERNELS', 'feature_map', 'global_attention', 'global_mixing', 'decayed_attention',
           'decayed_mixing']

KERNELS = ('elu', 'relu', 'softmax', 'identity')


def feature_map(x: Tensor, kernel: str) -> Tensor:
    """The kernel ``phi`` of linear attention, applied per head over the last dim.

    ``'elu'``: ELU(x) + 1 (MILA); ``'relu'``; ``'softmax'`` over the head features; ``'identity'``
    (Mamba's unconstrained B, C).
    """
    if kernel == 'elu':
        return F.elu(x) + 1.
    if kernel == 'relu':
        return F.relu(x)
    if kernel == 'softmax':
        return x.softmax(dim=-1)
    if kernel == 'identity':
        return x
    raise ValueError(f'kernel must be one of {KERNELS}, got {kernel!r}')


def _normalize(num: Tensor, den: Tensor, length: int, eps: float) -> Tensor:
    """``(num / L) / (den / L + eps)``; num (..., p) and den (...) aligned on the leading dims."""
    return (num / length) / (den / length + eps).unsqueeze(-1)


def global_attention(q: Tensor, k: Tensor, qr: Tensor, kr: Tensor, v: Tensor,
                     gate: Optional[Tensor], normalize: bool, eps: float) -> Tensor:
    """Global (non-causal) linear attention in O(L n p).

    Args:
        q, k (Tensor): (B, L, h, n) kernelized queries/keys (normalizer).
        qr, kr (Tensor): (B, L, h, n) the same after RoPE (numerator; pass ``q, k`` without RoPE).
        v (Tensor): (B, L, h, p) values.
        gate (Tensor | None): (B, L, h) input gate ``Delta`` (scales the values) or None.
        normalize (bool): divide by the attention normalizer.
        eps (float): normalizer epsilon.

    Returns:
        Tensor: (B, L, h, p) ``y = M v``.
    """
    vg = v if gate is None else v * gate.unsqueeze(-1)
    num = torch.einsum('blhn,bhnp->blhp', qr, torch.einsum('blhn,blhp->bhnp', kr, vg))
    if not normalize:
        return num
    den = torch.einsum('blhn,bhn->blh', q, k.sum(dim=1))
    return _normalize(num, den, q.shape[1], eps)


def global_mixing(q: Tensor, k: Tensor, qr: Tensor, kr: Tensor, gate: Optional[Tensor],
                  normalize: bool, eps: float) -> Tensor:
    """The matrix ``M`` (B, h, L, L) of :func:`global_attention` (same arguments, no ``v``)."""
    m = torch.einsum('bihn,bjhn->bhij', qr, kr)
    if gate is not None:
        m = m * gate.transpose(1, 2).unsqueeze(-2)
    if not normalize:
        return m
    den = torch.einsum('bihn,bhn->bhi', q, k.sum(dim=1))
    return _normalize(m, den, q.shape[1], eps)


def _scan(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, direction: str,
          chunk_size: int) -> Tensor:
    """SSD scan ``y = M_ssd x`` in one or both directions (diagonal counted once)."""
    y = ssd_scan(x, dt, A, B, C, chunk_size=chunk_size)
    if direction == 'causal':
        return y
    yb = ssd_scan(x.flip(1), dt.flip(1), A, B.flip(1), C.flip(1), chunk_size=chunk_size).flip(1)
    diag = (C * B).sum(-1) * dt  # (B, L, h): M_ssd[i, i]
    return y + yb - diag.unsqueeze(-1) * x


def _scan_matrix(dt: Tensor, A: Tensor, B: Tensor, C: Tensor, direction: str) -> Tensor:
    """The (B, h, L, L) matrix of :func:`_scan`."""
    m = ssd_mixing_matrix(dt, A, B, C)
    if direction == 'causal':
        return m
    mb = ssd_mixing_matrix(dt.flip(1), A, B.flip(1), C.flip(1)).flip(-1, -2)
    diag = ((C * B).sum(-1) * dt).transpose(1, 2)  # (B, h, L)
    return m + mb - torch.diag_embed(diag)


def decayed_attention(q: Tensor, k: Tensor, qr: Tensor, kr: Tensor, v: Tensor, dt: Tensor,
                      A: Tensor, in_scale: Optional[Tensor], normalize: bool, eps: float,
                      direction: str = 'bi', chunk_size: int = 256) -> Tensor:
    """Linear attention with a per-token forget gate ``exp(dt_t A)`` through the SSD scan.

    The scan feeds ``dt_t kr_t^T x_t``; passing ``x = v * in_scale`` makes the input weight
    ``dt * in_scale``: ``in_scale=None`` ties the input gate to the forget gate (Mamba: ``Delta =
    dt``), ``in_scale = 1 / dt`` gives a forget gate without input gate.

    Args:
        q, k, qr, kr, v: as in :func:`global_attention`.
        dt (Tensor): (B, L, h) positive step sizes; A (Tensor): (h,) negative rates.
        in_scale (Tensor | None): (B, L, h) extra input weight, or None.
        normalize (bool), eps (float): as in :func:`global_attention`.
        direction (str): ``'causal'`` or ``'bi'``. Defaults to ``'bi'``.
        chunk_size (int): SSD chunk size. Defaults to 256.

    Returns:
        Tensor: (B, L, h, p).
    """
    x = v if in_scale is None else v * in_scale.unsqueeze(-1)
    if not normalize:
        return _scan(x, dt, A, kr, qr, direction, chunk_size)
    ones = (1. / dt).unsqueeze(-1)  # the normalizer has no input gate
    if qr is q and kr is k:  # no RoPE: one scan over [x, 1 / dt]
        both = _scan(torch.cat([x, ones.to(x.dtype)], dim=-1), dt, A, k, q, direction, chunk_size)
        num, den = both[..., :-1], both[..., -1]
    else:
        num = _scan(x, dt, A, kr, qr, direction, chunk_size)
        den = _scan(ones, dt, A, k, q, direction, chunk_size)[..., 0]
    return _normalize(num, den, q.shape[1], eps)


def decayed_mixing(q: Tensor, k: Tensor, qr: Tensor, kr: Tensor, dt: Tensor, A: Tensor,
                   in_scale: Optional[Tensor], normalize: bool, eps: float,
                   direction: str = 'bi') -> Tensor:
    """The matrix ``M`` (B, h, L, L) of :func:`decayed_attention` (same arguments, no ``v``)."""
    m = _scan_matrix(dt, A, kr, qr, direction)
    if in_scale is not None:
        m = m * in_scale.transpose(1, 2).unsqueeze(-2)
    if not normalize:
        return m
    den = (_scan_matrix(dt, A, k, q, direction) / dt.transpose(1, 2).unsqueeze(-2)).sum(-1)
    return _normalize(m, den, q.shape[1], eps)
