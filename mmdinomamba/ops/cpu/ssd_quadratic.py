"""The SSD scan in its quadratic ("attention-like") form, for short sequences on CPU.

For ``L`` up to a few hundred tokens the semiseparable matrix of each head,

    M_ij = (C_i . B_j) exp(S_i - S_j) dt_j      (S = cumulative sum of a = dt A),

is small enough to use outright: no chunks, no state passing, no per-chunk small kernels. A
causal direction uses the lower triangle; an anti-causal one (the scan of the flipped sequence,
read in the original token order) the upper triangle with ``S`` the reverse cumulative sum, so
both directions of a bidirectional mixer run as one batch and nothing is flipped.

Two exact forms, chosen per (sample, direction, head) by the range ``rho = |S_first - S_last|``:

* factored (``rho <= 100``): ``exp(S_i - S_j) = exp(S_i - c) exp(c - S_j)`` with ``c`` the
  middle of the range (both factors within ``exp(+-50)``, computed in float64), so the decay
  moves into per-token scales of ``x`` and ``y`` and every head of a group shares one masked
  ``C^T B``: ``y = e_row * (tril(C^T B) @ (x dt e_col))``, ONE matrix product per group and no
  per-head (L, L) work at all;
* per head (``rho > 100``, strong decay, "wide" heads): ``W = exp(clamp(hi_i - hi_j, -60, 0))
  * C^T B`` built per head (``csrc/wide_fused.h`` says how, exactly).

The matrices are strictly lower (causal direction) or upper (anti-causal) triangular, so half
of each product with them adds zeros: cutting the tokens into ``k`` blocks
(:func:`block_bounds`) and skipping the blocks that are all zero leaves ``(k + 1) / (2 k)`` of
the work in a few larger GEMMs, each a task of its own, with the same non-zero terms as the full
product. Everything runs in the native kernels (:mod:`.native_cpu`), the element-wise work
fused with the products, one call each way for the factored heads and one for the wide heads.

Layout (channel-major, the layout of the conv that feeds the scan): ``x`` (b, R, h, p, L),
``dt`` (b, R, h, L), ``B``, ``C`` (b, R, g, n, L), ``A`` and ``D`` (R, h), where ``R`` indexes
the directions (index 0 causal, 1 anti-causal; R = 1 or 2) and head ``i`` reads group
``i // (h // g)``. The diagonal ``C_i . B_i dt_i + D`` is applied as a per-token scale, so the
matrices are strictly triangular. The operands are laid out as the kernels take them (planes
with contiguous (p, L) planes, contiguous per-token tensors).
"""
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.profiler import record_function

from .native_cpu import kernels

__all__ = ['ScanState', 'scan_forward', 'scan_backward', 'block_bounds', 'FACTORED_RANGE']

#: Largest decay range ``|S_first - S_last|`` of a head computed in the factored form (both
#: factors within ``exp(+-50)``); wider heads are computed per head.
FACTORED_RANGE = 100.0

#: At most this many token blocks, of at least ``MIN_BLOCK`` tokens (docs/results.md has the
#: timings); inner block boundaries fall on multiples of ``ALIGN`` (CPU GEMMs run faster on
#: such widths).
BLOCKS, MIN_BLOCK, ALIGN = 4, 64, 16


def block_bounds(length: int) -> list[int]:
    """Token boundaries of the blocks: ``BLOCKS`` near-equal blocks with inner boundaries on
    multiples of ``ALIGN`` (0, 64, 128, 197 at 197 tokens), or one block when that would make
    them shorter than ``MIN_BLOCK``."""
    k = max(1, min(BLOCKS, length // MIN_BLOCK))
    inner = [ALIGN * round(i * length / k / ALIGN) for i in range(1, k)]
    return [0, *inner, length]


@dataclass
class ScanState:
    """What :func:`scan_forward` computed, for :func:`scan_backward`.

    Attributes:
        S (Tensor): (b, R, h, L) float64 cumulative decay.
        row (Tensor): (b, R, h, L) ``exp(S - c)``, zero for per-head (wide) heads.
        col (Tensor): (b, R, h, L) ``exp(c - S)``, zero for wide heads.
        wide (Tensor): (b, R, h) bool, the heads computed per head.
        cb (Tensor): (b, R, g, L, L) ``C^T B`` masked to each direction's strict triangle.
        cb_diag (Tensor): (b, R, g, L) the diagonal ``C_i . B_i``.
        diag (Tensor): (b, R, h, L) per-token skip ``D + C_i . B_i dt_i``.
        ys (Tensor): (b, R, g, r p, L) the factored path's ``cb`` product (before the row
            scale) of its scanned values ``xs = x dt col`` (the backward pass recomputes them).
        y_wide (Tensor | None): (N, p, L) what the N wide heads added to ``y``
            (the kernel ``wide_forward``), None when no head is wide.
    """
    S: Tensor
    row: Tensor
    col: Tensor
    wide: Tensor
    cb: Tensor
    cb_diag: Tensor
    diag: Tensor
    ys: Tensor
    y_wide: Tensor | None = None


def cumulative(a: Tensor) -> Tensor:
    """Inclusive cumulative sum over tokens (b, R, h, L), in float64; reverse (``S_i =
    sum_{k >= i} a_k``) for the anti-causal direction ``R = 1``."""
    a = a.double()
    S = a.cumsum(-1)
    if S.shape[1] == 2:
        S[:, 1] = S[:, 1, :, -1:] - S[:, 1] + a[:, 1]
    return S


def _factors(dt: Tensor, A: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``S`` (float64), the factored path's scales ``row = exp(S - c)`` and
    ``col = exp(c - S)`` (zero for wide heads) and the ``wide`` mask (b, R, h)."""
    S = cumulative(dt * A[..., None])
    wide = (S[..., 0] - S[..., -1]).abs() > FACTORED_RANGE
    expo = (S - (S[..., :1] + S[..., -1:]) / 2).masked_fill_(wide[..., None], 0.)
    row = expo.exp().to(dt.dtype).masked_fill_(wide[..., None], 0.)
    col = expo.neg_().exp_().to(dt.dtype).masked_fill_(wide[..., None], 0.)
    return S, row, col, wide


def _triangle_product(a: Tensor, cb: Tensor, transpose: bool) -> Tensor:
    """``a @ cb^T`` (``transpose``) or ``a @ cb`` per direction and group of ``a`` (b, R, g, P, L)
    and the masked ``cb`` (b, R, g, L, L): with several token blocks in the native kernel
    (``column_products``), its zero blocks skipped; with one, PyTorch's batched
    GEMM, as fast or faster there (docs/results.md)."""
    bounds = block_bounds(a.shape[-1])
    if len(bounds) == 2:
        return torch.matmul(a, cb.mT if transpose else cb)
    out = a.new_empty(a.shape)  # column block j reads rows [0, j1) or [j0, L) of cb
    kernels().column_products(a, cb, out, bounds, transpose, transpose)
    return out


def _grouped(t: Tensor, groups: int) -> Tensor:
    """(b, R, h, p, L) -> (b, R, g, r p, L) (a view: the heads of a group side by side)."""
    return t.flatten(2, 3).unflatten(2, (groups, -1))


def scan_forward(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None,
                 factors: tuple[Tensor, Tensor, Tensor, Tensor] | None = None
                 ) -> tuple[Tensor, ScanState]:
    """``y`` (b, R, h, p, L) of every direction (layout in the module docstring) and the
    state for :func:`scan_backward`; ``factors``: ``S, row, col, wide`` of ``dt`` and ``A`` if
    already computed (as the kernel ``scan_factors`` does with ``dt``)."""
    g = B.shape[2]
    S, row, col, wide = _factors(dt, A) if factors is None else factors
    cb = C.new_empty(*C.shape[:3], C.shape[-1], C.shape[-1])  # C^T B on the strict triangles
    cb_diag = C.new_empty(*C.shape[:3], C.shape[-1])  # and its diagonal
    kernels().masked_outer(C, B, cb, block_bounds(B.shape[-1]), cb_diag)
    diag = dt.unflatten(2, (g, -1)).mul(cb_diag.unsqueeze(3)).flatten(2, 3)
    if D is not None:
        diag.add_(D[..., None])
    s = dt * col
    with record_function('bidir_ssd.scan.products'):
        ys, y = kernels().products_forward(x, s, cb, row, diag, block_bounds(x.shape[-1]))
    y_wide = None
    if wide.any():
        with record_function('bidir_ssd.scan.wide_heads'):
            y_wide = kernels().wide_forward(x, dt, S, cb, wide, block_bounds(x.shape[-1]), y)
    return y, ScanState(S, row, col, wide, cb, cb_diag, diag, _grouped(ys, g), y_wide)


def scan_backward(dy: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                  st: ScanState, with_D: bool) -> tuple[Tensor, ...]:
    """Gradients of :func:`scan_forward` for the output gradient ``dy`` (b, R, h, p, L).

    Returns:
        tuple: ``dx`` (like x), ``ddt`` (like dt), ``dA`` (R, h), ``dB``, ``dC`` (like B) and
        ``dD`` (R, h) or None.
    """
    g = B.shape[2]
    s, bounds = dt * st.col, block_bounds(x.shape[-1])
    # dxs_x: through xs = x dt col, the dt and S factors of column j; dys_ys: S_i enters y_i
    # through row_i (+) and x_i through col_i (-); q: through the diagonal scale
    with record_function('bidir_ssd.scan.products'):
        dx, dcb, dxs_x, dys_ys, q = kernels().products_backward(
            dy, x, st.ys.view(x.shape), s, st.row, st.diag, st.cb, bounds)
    dS = dys_ys.sub_(dxs_x * s)
    ddt = dxs_x.mul_(st.col)
    ddt += (q.unflatten(2, (g, -1)) * st.cb_diag.unsqueeze(3)).flatten(2, 3)
    dA_wide = None
    if st.wide.any():
        with record_function('bidir_ssd.scan.wide_heads'):
            dA_wide = kernels().wide_backward(dy, x, dt, st.S, st.cb, st.wide, bounds, dx, ddt,
                                              dS, dcb)
    dcb_diag = (q * dt).unflatten(2, (g, -1)).sum(3)
    dB, dC = _triangle_product(C, dcb, False), _triangle_product(B, dcb, True)
    dB.addcmul_(C, dcb_diag.unsqueeze(-2))
    dC.addcmul_(B, dcb_diag.unsqueeze(-2))
    da = decay_grad(dS)
    ddt += da.to(ddt.dtype) * A[..., None]
    dA = (da * dt.double()).masked_fill_(st.wide[..., None], 0.).sum((0, 3))
    if dA_wide is not None:
        dA += dA_wide
    dD = q.sum((0, 3)) if with_D else None
    return dx, ddt, dA.to(A.dtype), dB, dC, dD


def decay_grad(dS: Tensor) -> Tensor:
    """Gradient w.r.t. ``a`` (float64) from the gradient w.r.t. ``S`` (b, R, h, L): a reverse
    cumulative sum for the causal direction, a cumulative sum for the anti-causal one."""
    d = dS.double()
    out = torch.empty_like(d)
    out[:, 0] = d[:, 0].flip(-1).cumsum(-1).flip(-1)
    if d.shape[1] == 2:
        out[:, 1] = d[:, 1].cumsum(-1)
    return out
