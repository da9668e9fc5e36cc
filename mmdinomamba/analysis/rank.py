"""Block-rank analysis of the token-mixing matrix ``M`` (paper Sec. 3, Eq. 12-17, Appendix G).

All three mixers compute ``Y = M X`` per head. The paper cuts ``M`` (L, L) into a grid of C x C
blocks and bounds the rank of the off-diagonal blocks (Eq. 16-17)::

    softmax attention : R_off = C
    Mamba (SSD)       : R_off <= rank(L_M^off) * N        (N = state size)
    linear attention  : R_off <= D_QK                     (feature size of psi(Q), psi(K))

Conventions used here (stated in every report):

* **Blocks.** ``split_blocks`` keeps the ``nb = L // C`` full blocks per side; when ``L`` is not a
  multiple of ``C`` the ragged last ``L % C`` rows and columns are **dropped** (``ragged='drop'``,
  the count is kept in ``BlockRanks.dropped``) or rejected (``ragged='error'``).
* **Block kinds.** ``diag`` (block row == block column), ``lower`` (row > column: the paper's
  off-diagonal blocks of a lower-triangular M) and ``upper`` (row < column: non-zero only for the
  non-causal / bidirectional matrices the backbones actually use).
* **Ranks** are computed from float64 singular values (``torch.linalg.svdvals``, batched):
  numerical rank = #{s_i > max(rel_tol * s_max, abs_tol)} (``torch.linalg.matrix_rank``'s rule),
  reported twice, with the relative tolerance (default ``rel_tol=1e-6``, ``abs_tol=0``) and with
  an absolute one only (default ``abs_tol=1e-8``, in the units of M). Because the numerical rank
  depends on the tolerance, the entropy effective rank (Roy & Vetterli, 2007) is reported too:
  ``erank = exp(H(p))``, ``p = s / sum(s)`` (``C`` for the identity, 1 for a rank-1 matrix).
* **Views.** ``CAUSAL``: the paper's lower-triangular M (Eq. 12): ``L_Attn o M`` (``causal_mask``)
  for softmax / linear attention, the forward scan for Mamba. ``AS_USED``: the matrix the backbone
  applies (non-causal attention; ``(M_fwd + flip M_bwd) / 2`` for the bidirectional SSD).
"""
import math
from dataclasses import dataclass
from typing import Dict, Optional

import torch
from torch import Tensor

from mmdinomamba.ops import ssd_decay_matrix

__all__ = [
    'CAUSAL', 'AS_USED', 'BLOCK_KINDS', 'BlockRanks', 'split_blocks', 'block_singular_values',
    'numerical_rank', 'effective_rank', 'block_masks', 'block_ranks', 'causal_mask',
    'ssd_decay_mask', 'rank_bound'
]

CAUSAL = 'causal (paper Eq. 12)'
AS_USED = 'as used (bidirectional)'
BLOCK_KINDS = ('diag', 'lower', 'upper')
RAGGED_MODES = ('drop', 'error')


def split_blocks(m: Tensor, block_size: int, ragged: str = 'drop') -> Tensor:
    """Cut square matrices into a grid of ``block_size`` x ``block_size`` blocks.

    Args:
        m (Tensor): (..., L, L) matrices.
        block_size (int): block side ``C`` (1 <= C <= L).
        ragged (str): 'drop' (discard the last ``L % C`` rows and columns) or 'error'.
            Defaults to 'drop'.

    Returns:
        Tensor: (..., nb, nb, C, C) view-derived blocks with ``nb = L // C``;
        ``out[..., r, c] == m[..., r*C:(r+1)*C, c*C:(c+1)*C]``.
    """
    if m.dim() < 2 or m.shape[-1] != m.shape[-2]:
        raise ValueError(f'split_blocks expects (..., L, L) square matrices, got {tuple(m.shape)}')
    if ragged not in RAGGED_MODES:
        raise ValueError(f'ragged must be one of {RAGGED_MODES}, got {ragged!r}')
    length = m.shape[-1]
    if not 1 <= block_size <= length:
        raise ValueError(f'block_size={block_size} must be in [1, L={length}]')
    if length % block_size and ragged == 'error':
        raise ValueError(f'L={length} is not a multiple of block_size={block_size} '
                         "(use ragged='drop' to discard the last rows/columns)")
    nb = length // block_size
    m = m[..., :nb * block_size, :nb * block_size]
    m = m.reshape(*m.shape[:-2], nb, block_size, nb, block_size)
    return m.transpose(-3, -2)


def block_singular_values(m: Tensor, block_size: int, ragged: str = 'drop',
                          chunk: int = 64) -> Tensor:
    """Float64 singular values of every block, computed ``chunk`` blocks at a time.

    Args:
        m (Tensor): (..., L, L) matrices (any float dtype; converted per chunk).
        block_size (int): block side ``C``.
        ragged (str): see :func:`split_blocks`. Defaults to 'drop'.
        chunk (int): blocks per batched SVD call (bounds float64 memory). Defaults to 64.

    Returns:
        Tensor: (..., nb, nb, C) float64 singular values, descending.
    """
    blocks = split_blocks(m, block_size, ragged)
    flat = blocks.reshape(-1, block_size, block_size)
    out = [torch.linalg.svdvals(flat[i:i + chunk].to(torch.float64))
           for i in range(0, flat.shape[0], chunk)]
    return torch.cat(out).reshape(*blocks.shape[:-1])


def numerical_rank(s: Tensor, rel_tol: float = 1e-6, abs_tol: float = 0.0) -> Tensor:
    """Number of singular values above ``max(rel_tol * s_max, abs_tol)``.

    Args:
        s (Tensor): (..., k) non-negative singular values.
        rel_tol (float): tolerance relative to the largest one. Defaults to 1e-6.
        abs_tol (float): absolute tolerance. Defaults to 0.

    Returns:
        Tensor: (...) long ranks (0 for a zero matrix).
    """
    if rel_tol < 0 or abs_tol < 0:
        raise ValueError(f'tolerances must be >= 0, got rel_tol={rel_tol}, abs_tol={abs_tol}')
    smax = s.amax(dim=-1, keepdim=True)
    thr = torch.clamp(rel_tol * smax, min=abs_tol)
    return (s > thr).sum(dim=-1)


def effective_rank(s: Tensor) -> Tensor:
    """Entropy effective rank ``exp(-sum p log p)``, ``p = s / sum(s)`` (Roy & Vetterli, 2007).

    Args:
        s (Tensor): (..., k) non-negative singular values.

    Returns:
        Tensor: (...) float64 effective ranks in [1, k] (0 for a zero matrix).
    """
    s = s.to(torch.float64)
    total = s.sum(dim=-1, keepdim=True)
    p = s / total.clamp_min(torch.finfo(torch.float64).tiny)
    ent = -torch.special.xlogy(p, p).sum(dim=-1)
    return torch.where(total.squeeze(-1) > 0, ent.exp(), torch.zeros_like(ent))


def block_masks(nb: int) -> Dict[str, Tensor]:
    """Boolean (nb, nb) masks of the ``diag``, ``lower`` (row > col) and ``upper`` blocks."""
    r = torch.arange(nb)
    return {
        'diag': r[:, None] == r[None, :],
        'lower': r[:, None] > r[None, :],
        'upper': r[:, None] < r[None, :]
    }


@dataclass
class BlockRanks:
    """Per-block spectra and ranks of a batch of matrices.

    Attributes:
        sv (Tensor): (..., nb, nb, C) float64 singular values, descending.
        rank (Tensor): (..., nb, nb) numerical rank with ``rel_tol`` (and no absolute floor).
        rank_abs (Tensor): (..., nb, nb) numerical rank with ``abs_tol`` only.
        erank (Tensor): (..., nb, nb) entropy effective rank.
        block_size (int): C.
        rel_tol (float): relative tolerance of ``rank``.
        abs_tol (float): absolute tolerance of ``rank_abs``.
        dropped (int): ragged rows/columns left out (``L % C``).
    """
    sv: Tensor
    rank: Tensor
    rank_abs: Tensor
    erank: Tensor
    block_size: int
    rel_tol: float
    abs_tol: float
    dropped: int

    @property
    def num_blocks(self) -> int:
        return self.rank.shape[-1]

    def select(self, kind: str) -> Dict[str, Tensor]:
        """Values of one block kind: ``rank``, ``rank_abs``, ``erank`` as (..., n_kind)."""
        if kind not in BLOCK_KINDS:
            raise ValueError(f'kind must be one of {BLOCK_KINDS}, got {kind!r}')
        mask = block_masks(self.num_blocks)[kind].to(self.rank.device)
        return {k: getattr(self, k)[..., mask] for k in ('rank', 'rank_abs', 'erank')}


def block_ranks(m: Tensor, block_size: int = 256, rel_tol: float = 1e-6, abs_tol: float = 1e-8,
                ragged: str = 'drop') -> BlockRanks:
    """Spectra, numerical ranks and effective ranks of all C x C blocks of ``m``.

    Args:
        m (Tensor): (..., L, L) matrices, e.g. (B, heads, L, L) mixing matrices.
        block_size (int): C. Defaults to 256 (the paper's chunk size).
        rel_tol (float): relative tolerance of ``rank``. Defaults to 1e-6.
        abs_tol (float): absolute tolerance of ``rank_abs``. Defaults to 1e-8.
        ragged (str): see :func:`split_blocks`. Defaults to 'drop'.

    Returns:
        BlockRanks: per-block results with leading dims of ``m``.
    """
    sv = block_singular_values(m, block_size, ragged)
    return BlockRanks(sv=sv, rank=numerical_rank(sv, rel_tol, 0.0),
                      rank_abs=numerical_rank(sv, 0.0, abs_tol), erank=effective_rank(sv),
                      block_size=block_size, rel_tol=rel_tol, abs_tol=abs_tol,
                      dropped=m.shape[-1] % block_size)


def causal_mask(m: Tensor) -> Tensor:
    """The paper's causal M (Eq. 4, 12): ``L_Attn o M`` with ``L_Attn`` lower triangular ones.

    No re-normalization: re-normalizing the kept entries of each row (true causal attention)
    multiplies every row by a positive number, which changes no block's rank.

    Args:
        m (Tensor): (..., L, L).

    Returns:
        Tensor: (..., L, L) lower-triangular part (diagonal included).
    """
    return torch.tril(m)


def ssd_decay_mask(dt: Tensor, A: Tensor) -> Tensor:
    """Mamba-2's learnable causal mask ``L_M`` (Eq. 10) in float64.

    ``L_M[b, h, i, j] = exp(sum_{k=j+1..i} dt[b, k, h] * A[h])`` for ``i >= j``, else 0 (the
    convention of ``mmdinomamba.ops.ssd_mixing_matrix``: ``M = L_M o (C B^T) o dt_j``). With a
    scalar decay per step and head, every off-diagonal block is ``diag(u) 1 1^T diag(v)``, i.e.
    rank 1 in exact arithmetic.

    Args:
        dt (Tensor): (B, L, h) positive step sizes.
        A (Tensor): (h,) negative decay rates.

    Returns:
        Tensor: (B, h, L, L) float64 lower-triangular mask.
    """
    if dt.dim() != 3 or A.shape != (dt.shape[-1], ):
        raise ValueError(f'ssd_decay_mask: dt must be (B, L, h) and A (h,), '
                         f'got dt {tuple(dt.shape)}, A {tuple(A.shape)}')
    return ssd_decay_matrix(dt, A)


def rank_bound(kind: str, block_size: int, d_qk: Optional[int] = None,
               d_state: Optional[int] = None, lm_off_rank: Optional[float] = None) -> float:
    """The paper's upper bound on the off-diagonal block rank (Eq. 16-17), capped at C.

    Args:
        kind (str): 'softmax' (C), 'linear' (D_QK) or 'mamba' (rank(L_M^off) * N).
        block_size (int): C.
        d_qk (int, optional): feature size of psi(Q) / psi(K) (linear).
        d_state (int, optional): state size N (mamba).
        lm_off_rank (float, optional): rank of the off-diagonal blocks of L_M (mamba).

    Returns:
        float: the bound (``nan`` for an unknown kind).
    """
    if kind == 'softmax':
        return float(block_size)
    if kind == 'linear':
        if d_qk is None:
            raise ValueError("rank_bound('linear') needs d_qk")
        return float(min(block_size, d_qk))
    if kind == 'mamba':
        if d_state is None or lm_off_rank is None:
            raise ValueError("rank_bound('mamba') needs d_state and lm_off_rank")
        return float(min(block_size, lm_off_rank * d_state))
    return math.nan
