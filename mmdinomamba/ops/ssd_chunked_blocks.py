"""Views and per-chunk pieces shared by the chunked SSD scan's forward (``ssd_chunked.py``) and
hand-written backward (``ssd_chunked_bwd.py``).

Shapes: ``b`` batch, ``c`` chunks of ``Q`` tokens, ``g`` groups of ``r`` heads, ``p`` head
channels, ``n`` state size.
"""
import torch
from torch import Tensor

__all__ = ['EXP_FLOOR', 'exp_decay', 'chunk_views', 'head_major', 'heads_as_columns',
           'columns_as_heads', 'intra_chunk_weights']

EXP_FLOOR = -60.0


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
