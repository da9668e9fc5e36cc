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
  ``C^T B``: ``y = e_row * (tril(C^T B) @ (x dt e_col))``, ONE matrix product per group (its
  all-zero blocks skipped, :mod:`.ssd_triangles`) and no per-head (L, L) work at all;
* per head (``rho > 100``, strong decay): ``W = exp(clamp(hi_i - hi_j, -60, 0)) * C^T B``
  built per head (:mod:`.ssd_quadratic_heads`).

Layout (channel-major, the layout of the conv that feeds the scan): ``x`` (b, R, h, p, L),
``dt`` (b, R, h, L), ``B``, ``C`` (b, R, g, n, L), ``A`` and ``D`` (R, h), where ``R`` indexes
the directions (index 0 causal, 1 anti-causal; R = 1 or 2) and head ``i`` reads group
``i // (h // g)``. The diagonal ``C_i . B_i dt_i + D`` is applied as a per-token scale, so the
matrices are strictly triangular.
"""
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.profiler import record_function

from . import native_cpu
from . import ssd_quadratic_heads as heads
from ..reference import FACTORED_RANGE
from .ssd_quadratic_heads import cumulative
from .ssd_triangles import (apply_masked, apply_masked_t, block_bounds, mask_triangles,
                            masked_outer)

__all__ = ['ScanState', 'scan_forward', 'scan_backward', 'ssd_scan_quadratic', 'FACTORED_RANGE']


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
        y_wide (Tensor | None): (N, p, L) what the N wide heads added to ``y``.
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

    def output(self, x: Tensor, native: bool = False) -> Tensor:
        """``y`` of :func:`scan_forward` again, from this state and ``x`` (b, R, h, p, L)
        (``native`` as there)."""
        y = _output(self.ys.view(x.shape), self.row, x, self.diag, native)
        if self.y_wide is not None:
            heads.add_saved(y, self.y_wide, self.wide)
        return y


def _factors(dt: Tensor, A: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``S`` (float64), the factored path's scales ``row = exp(S - c)`` and
    ``col = exp(c - S)`` (zero for wide heads) and the ``wide`` mask (b, R, h)."""
    S = cumulative(dt * A[..., None])
    wide = (S[..., 0] - S[..., -1]).abs() > FACTORED_RANGE
    expo = (S - (S[..., :1] + S[..., -1:]) / 2).masked_fill_(wide[..., None], 0.)
    row = expo.exp().to(dt.dtype).masked_fill_(wide[..., None], 0.)
    col = expo.neg_().exp_().to(dt.dtype).masked_fill_(wide[..., None], 0.)
    return S, row, col, wide


def _group_products(B: Tensor, C: Tensor, native: bool = False) -> tuple[Tensor, Tensor]:
    """``C^T B`` per group (b, R, g, L, L) masked to each direction's strict triangle, and its
    diagonal (b, R, g, L) (``native``: in the native kernel where ``B`` and ``C`` suit it,
    :func:`.native_cpu.masked_outer`)."""
    if native and native_cpu.planes_fit(B, C):
        return native_cpu.masked_outer(C, B, block_bounds(B.shape[-1]), diag=True)
    cb = torch.matmul(C.transpose(-1, -2), B)
    cb_diag = cb.diagonal(dim1=-2, dim2=-1).clone()
    return mask_triangles(cb), cb_diag


def _scaled(x: Tensor, s: Tensor, native: bool) -> Tensor:
    """``x * s.unsqueeze(-2)``: (b, R, h, p, L) times a per-token scale (b, R, h, L); ``native``:
    in the native kernel where ``x`` suits it."""
    if native and native_cpu.planes_fit(x):
        return native_cpu.scale_tokens(x, s)
    return x * s.unsqueeze(-2)


def _output(ys: Tensor, row: Tensor, x: Tensor, diag: Tensor, native: bool) -> Tensor:
    """``y = ys row + x diag`` from the factored path's product ``ys`` (b, R, h, p, L)."""
    if native and native_cpu.planes_fit(ys, x):
        return native_cpu.scan_output(ys, row, x, diag)
    return (ys * row.unsqueeze(-2)).addcmul_(x, diag.unsqueeze(-2))


def _products_fused(native: bool, planes: list[Tensor], flat: list[Tensor]) -> bool:
    """Whether the factored products run with their element-wise work in one native call
    (:func:`.native_cpu.products_forward`, :func:`.native_cpu.products_backward`): asked to
    (``native``) and operands as :func:`.native_cpu.fused_fit` says."""
    return native and native_cpu.fused_fit(planes, flat)


def _grouped(t: Tensor, groups: int) -> Tensor:
    """(b, R, h, p, L) -> (b, R, g, r p, L) (a view: the heads of a group side by side)."""
    return t.flatten(2, 3).unflatten(2, (groups, -1))


def scan_forward(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None,
                 native: bool = False,
                 factors: tuple[Tensor, Tensor, Tensor, Tensor] | None = None
                 ) -> tuple[Tensor, ScanState]:
    """``y`` (b, R, h, p, L) of every direction (layout in the module docstring) and the
    state for :func:`scan_backward`; ``native``: the element-wise work around the matrix
    products and the strongly decaying heads' in the native CPU kernels (:mod:`.native_cpu`);
    ``factors``: ``S, row, col, wide`` of ``dt`` and ``A`` if already computed (as
    :func:`.native_cpu.scan_factors` does with ``dt``)."""
    g = B.shape[2]
    S, row, col, wide = _factors(dt, A) if factors is None else factors
    cb, cb_diag = _group_products(B, C, native)
    diag = dt.unflatten(2, (g, -1)).mul(cb_diag.unsqueeze(3)).flatten(2, 3)
    if D is not None:
        diag.add_(D[..., None])
    s = dt * col
    with record_function('bidir_ssd.scan.products'):
        if _products_fused(native, [x], [s, row, diag, cb]):
            ys, y = native_cpu.products_forward(x, s, cb, row, diag, block_bounds(x.shape[-1]))
            ys = _grouped(ys, g)
        else:
            ys = apply_masked(_grouped(_scaled(x, s, native), g), cb, native)
            y = _output(ys.view(x.shape), row, x, diag, native)
    y_wide = heads.add_forward(y, x, dt, S, cb, wide, native) if wide.any() else None
    return y, ScanState(S, row, col, wide, cb, cb_diag, diag, ys, y_wide)


def scan_backward(dy: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                  st: ScanState, with_D: bool, native: bool = False) -> tuple[Tensor, ...]:
    """Gradients of :func:`scan_forward` for the output gradient ``dy`` (b, R, h, p, L)
    (``native`` as there).

    Returns:
        tuple: ``dx`` (like x), ``ddt`` (like dt), ``dA`` (R, h), ``dB``, ``dC`` (like B) and
        ``dD`` (R, h) or None.
    """
    g = B.shape[2]
    s, ys = dt * st.col, st.ys.view(x.shape)
    # dxs_x: through xs = x dt col, the dt and S factors of column j; dys_ys: S_i enters y_i
    # through row_i (+) and x_i through col_i (-); q: through the diagonal scale
    if _products_fused(native, [x, dy], [ys, s, st.row, st.diag, st.cb]):
        with record_function('bidir_ssd.scan.products'):
            dx, dcb, dxs_x, dys_ys, q = native_cpu.products_backward(
                dy, x, ys, s, st.row, st.diag, st.cb, block_bounds(x.shape[-1]))
    else:
        xs = _grouped(_scaled(x, s, native), g)  # the forward pass's scanned values, again
        dys = _scaled(dy, st.row, native)
        dys_g = _grouped(dys, g)
        dxs = apply_masked_t(dys_g, st.cb, native).view(x.shape)
        dcb = masked_outer(dys_g, xs, native)
        if native and dxs.is_contiguous() and native_cpu.planes_fit(x, dy, dys, ys):
            dxs_x, dys_ys, q = native_cpu.scan_backward_pointwise(dxs, x, dy, dys, ys, s,
                                                                  st.diag)
            dx = dxs
        else:
            scratch = torch.empty_like(dxs)
            dxs_x, dys_ys = _dot(dxs, x, scratch), _dot(dys, ys, scratch)
            q = _dot(dy, x, scratch)
            dx = dxs.mul_(s.unsqueeze(-2)).addcmul_(dy, st.diag.unsqueeze(-2))
    dS = dys_ys.sub_(dxs_x * s)
    ddt = dxs_x.mul_(st.col)
    ddt += (q.unflatten(2, (g, -1)) * st.cb_diag.unsqueeze(3)).flatten(2, 3)
    dA_wide = None
    if st.wide.any():
        dA_wide = heads.add_backward(dy, x, dt, st.S, st.cb, st.wide, dx, ddt, dS, dcb,
                                     native)
    dcb_diag = (q * dt).unflatten(2, (g, -1)).sum(3)
    if native and native_cpu.planes_fit(B, C, dcb):  # dcb's zero blocks skipped
        dB, dC = apply_masked_t(C, dcb, True), apply_masked(B, dcb, True)
    else:
        dB, dC = torch.matmul(C, dcb), torch.matmul(B, dcb.mT)
    dB.addcmul_(C, dcb_diag.unsqueeze(-2))
    dC.addcmul_(B, dcb_diag.unsqueeze(-2))
    da = decay_grad(dS)
    ddt += da.to(ddt.dtype) * A[..., None]
    dA = (da * dt.double()).masked_fill_(st.wide[..., None], 0.).sum((0, 3))
    if dA_wide is not None:
        dA += dA_wide
    dD = q.sum((0, 3)) if with_D else None
    return dx, ddt, dA.to(A.dtype), dB, dC, dD


def _dot(a: Tensor, b: Tensor, scratch: Tensor) -> Tensor:
    """Per-head channel sums ``sum_p a * b`` of (b, R, h, p, L) tensors -> (b, R, h, L), the
    product written into ``scratch`` (faster than ``linalg.vecdot`` and a fresh product)."""
    return torch.mul(a, b, out=scratch).sum(-2)


def decay_grad(dS: Tensor) -> Tensor:
    """Gradient w.r.t. ``a`` (float64) from the gradient w.r.t. ``S`` (b, R, h, L): a reverse
    cumulative sum for the causal direction, a cumulative sum for the anti-causal one."""
    d = dS.double()
    out = torch.empty_like(d)
    out[:, 0] = d[:, 0].flip(-1).cumsum(-1).flip(-1)
    if d.shape[1] == 2:
        out[:, 1] = d[:, 1].cumsum(-1)
    return out


def _channel_major(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                   D: Tensor | None) -> tuple:
    """Standard SSD layout -> one causal direction of the channel-major layout (copies)."""
    return (x.permute(0, 2, 3, 1).unsqueeze(1).contiguous(),
            dt.transpose(1, 2).unsqueeze(1).contiguous(), A.unsqueeze(0),
            B.permute(0, 2, 3, 1).unsqueeze(1).contiguous(),
            C.permute(0, 2, 3, 1).unsqueeze(1).contiguous(),
            None if D is None else D.unsqueeze(0))


def _token_major(t: Tensor) -> Tensor:
    """(b, 1, h, p, L) -> (b, L, h, p) (a view)."""
    return t.squeeze(1).permute(0, 3, 1, 2)


class _QuadraticSSD(torch.autograd.Function):
    """Causal SSD scan in the quadratic form; keeps its inputs, recomputes the rest."""

    @staticmethod
    def forward(ctx, x, dt, A, B, C, D):
        ctx.native = native_cpu.use_for(x)
        y = scan_forward(*_channel_major(x, dt, A, B, C, D), ctx.native)[0]
        ctx.save_for_backward(x, dt, A, B, C, D)
        return _token_major(y)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, dt, A, B, C, D = ctx.saved_tensors
        xc, dtc, Ac, Bc, Cc, Dc = _channel_major(x, dt, A, B, C, D)
        st = scan_forward(xc, dtc, Ac, Bc, Cc, Dc, ctx.native)[1]
        dyc = dy.permute(0, 2, 3, 1).unsqueeze(1)
        dx, ddt, dA, dB, dC, dD = scan_backward(dyc, xc, dtc, Ac, Bc, Cc, st, D is not None,
                                                ctx.native)
        return (_token_major(dx), ddt.squeeze(1).transpose(1, 2), dA[0], _token_major(dB),
                _token_major(dC), None if dD is None else dD[0])


def ssd_scan_quadratic(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                       D: Tensor | None = None) -> Tensor:
    """Causal SSD scan by its (L, L) matrices; exact to :func:`ssd_scan_ref` up to rounding.
    Memory and work grow with ``L^2``: meant for ``L`` up to a few hundred.

    Args:
        x (Tensor): (batch, length, heads, headdim).
        dt (Tensor): (batch, length, heads) positive step sizes.
        A (Tensor): (heads,) negative decay rates.
        B (Tensor): (batch, length, groups, state).
        C (Tensor): (batch, length, groups, state).
        D (Tensor, optional): (heads,) skip weights. Defaults to None.

    Returns:
        Tensor: (batch, length, heads, headdim) in the dtype of ``x`` (float16 / bfloat16
        inputs are computed in float32).
    """
    out_dtype = x.dtype
    dtype = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    args = [None if t is None else t.to(dtype) for t in (x, dt, A, B, C, D)]
    with torch.autocast(device_type=x.device.type, enabled=False):
        return _QuadraticSSD.apply(*args).to(out_dtype)
