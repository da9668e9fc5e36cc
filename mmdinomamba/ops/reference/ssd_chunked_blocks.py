"""Views and per-chunk pieces shared by the chunked SSD scan's forward (``ssd_chunked.py``) and
hand-written backward (``ssd_chunked_bwd.py``).

Shapes: ``b`` batch, ``c`` chunks of ``Q`` tokens, ``g`` groups of ``r`` heads, ``p`` head
channels, ``n`` state size.
"""
import torch
from torch import Tensor

__all__ = ['EXP_FLOOR', 'FACTORED_RANGE', 'exp_decay', 'chunk_views', 'head_major',
           'heads_as_columns', 'columns_as_heads', 'intra_chunk_weights', 'factored_scales',
           'factored_intra']

EXP_FLOOR = -60.0
#: Largest decay range ``|s_last - s_first|`` of a head (the quadratic form) or of a chunk (the
#: chunked scan's diagonal blocks) computed in the factored form: both factors ``exp(+-50)``.
FACTORED_RANGE = 100.0


def exp_decay(t: Tensor) -> Tensor:
    """``exp`` of decay exponents (``t <= 0``), clamped to ``[-60, 0]``, in place on ``t``.

    Clamping from above maps the (masked) upper triangle of a chunk to ``exp(0)``; clamping
    from below keeps every factor a normal float: factors under ``exp(-60)`` (1e-26) would
    otherwise become subnormal, zero or come from ``-inf``, and such exponentials are 20-200x
    slower on x86 CPUs. The change to any output is below 1e-26 relative.
    """
    return t.clamp_(EXP_FLOOR, 0.0).exp_()


def chunk_views(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, Q: int):
    """Chunked views of one block of ``c`` full chunks (length ``c * Q``).

    Returns ``xv`` (b, c, Q, g, r, p), ``dtv`` (b, c, Q, g, r), ``acs`` (b, c, Q, g, r) the
    chunk-local cumulative sum of ``dt * A``, and ``Bg``, ``Cg`` (b, g, c, Q, n).
    """
    b, length, h, p = x.shape
    g, n = B.shape[2:]
    r, c = h // g, length // Q
    xv = x.reshape(b, c, Q, g, r, p)
    dtv = dt.reshape(b, c, Q, g, r)
    acs = (dtv * A.reshape(g, r)).cumsum(dim=2)
    Bg = B.reshape(b, c, Q, g, n).permute(0, 3, 1, 2, 4)
    Cg = C.reshape(b, c, Q, g, n).permute(0, 3, 1, 2, 4)
    return xv, dtv, acs, Bg, Cg


def head_major(t: Tensor) -> Tensor:
    """(b, c, Q, g, r, p) <-> (b, g, r, c, Q, p) (token-major <-> head-major; a view)."""
    return t.permute(0, 3, 4, 1, 2, 5)


def heads_as_columns(t: Tensor) -> Tensor:
    """(b, c, Q, g, r, p) -> (b, g, c, Q, r*p): heads of a group side by side (GEMM columns)."""
    b, c, Q, g, r, p = t.shape
    return t.permute(0, 3, 1, 2, 4, 5).reshape(b, g, c, Q, r * p)


def columns_as_heads(t: Tensor, p: int) -> Tensor:
    """(b, g, c, Q, r*p) -> (b, c, Q, g, r, p) (a view)."""
    b, g, c, Q, rp = t.shape
    return t.reshape(b, g, c, Q, rp // p, p).permute(0, 2, 3, 1, 4, 5)


def intra_chunk_weights(acs: Tensor, dtv: Tensor, Bg: Tensor, Cg: Tensor):
    """Diagonal-block weights ``W[i, j] = (C_i . B_j) exp(s_i - s_j) dt_j`` (j <= i, else 0).

    Returns ``W`` and ``E = exp(s_i - s_j)`` (b, g, r, c, Q, Q) and ``cb`` (b, g, c, Q, Q).
    """
    acs_h = acs.permute(0, 3, 4, 1, 2)  # (b, g, r, c, Q)
    cb = torch.matmul(Cg, Bg.transpose(-1, -2)).tril_()
    E = exp_decay(acs_h[..., :, None] - acs_h[..., None, :])
    W = (E * cb.unsqueeze(2)).mul_(dtv.permute(0, 3, 4, 1, 2).unsqueeze(-2))
    return W, E, cb


def factored_scales(dtv: Tensor, A: Tensor, acs: Tensor) -> tuple[Tensor, Tensor] | None:
    """Per-token scales of the factored diagonal blocks, or None for a block with a (sample,
    chunk, head) whose decay range ``|s_Q - s_1|`` exceeds :data:`FACTORED_RANGE`.

    ``exp(s_i - s_j) = exp(s_i - m) exp(m - s_j)`` with ``m`` the middle of the chunk's range:
    both factors stay within ``exp(+-50)`` (computed in float64, then rounded), so the decay
    moves into scales of rows and columns and all heads of a group share one masked ``C B^T``.

    Args:
        dtv (Tensor): (b, c, Q, g, r) step sizes of the block's chunks.
        A (Tensor): (h,) decay rates.
        acs (Tensor): (b, c, Q, g, r) the chunk-local cumulative sums of ``dt A`` (the test).

    Returns:
        tuple | None: ``row = exp(s - m)`` and ``col = exp(m - s)`` (b, c, Q, g, r).
    """
    if ((acs[:, :, 0] - acs[:, :, -1]).abs() > FACTORED_RANGE).any():  # cheap test first
        return None
    g, r = dtv.shape[-2:]
    acs = (dtv.double() * A.double().reshape(g, r)).cumsum(dim=2)
    expo = acs - (acs[:, :, :1] + acs[:, :, -1:]) / 2
    return expo.exp().to(dtv.dtype), expo.neg_().exp_().to(dtv.dtype)


def factored_intra(xv: Tensor, dtv: Tensor, Bg: Tensor, Cg: Tensor, row: Tensor,
                   col: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Diagonal blocks in the factored form: ``y_i = row_i sum_{j<=i} (C_i . B_j) dt_j col_j
    x_j``, ONE matrix product per group for all its heads.

    Returns ``y`` (b, c, Q, g, r, p) (a view), the masked ``cb`` (b, g, c, Q, Q) and the
    scanned values ``xs = x dt col`` as columns (b, g, c, Q, r*p).
    """
    cb = torch.matmul(Cg, Bg.transpose(-1, -2)).tril_()
    xs = heads_as_columns(xv * (dtv * col)[..., None])
    y = columns_as_heads(torch.matmul(cb, xs), xv.shape[-1]).mul_(row[..., None])
    return y, cb, xs
