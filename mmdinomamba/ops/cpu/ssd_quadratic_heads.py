"""The quadratic SSD form per head, for the heads whose decay range is too wide to factor.

Used by :mod:`.ssd_quadratic` for the (sample, direction, head) triples with
``|S_first - S_last| > FACTORED_RANGE`` (strong decay): their matrices

    W_ij = exp(clamp(hi_i - hi_j, -60, 0)) (C_i . B_j)      (strict triangle)

are built per head. ``S`` is summed in float64 and split into ``hi + lo`` (``hi`` its rounding
to the compute dtype): ``hi_i - hi_j`` is exact near the diagonal, where it matters, and the
small remainders enter as scales ``exp(lo_i)`` of ``y`` and ``exp(-lo_j)`` of ``x``, so long
strongly decaying sequences keep float32 accuracy. Clamping the exponents at -60 keeps every
factor a normal float (subnormal exponentials are 20-200x slower on x86) and changes outputs by
less than 1e-26 relative. ``dA`` is summed pair by pair (``sum_ij G_ij (T_i - T_j)``, ``T`` the
cumulative ``dt``), because ``sum_i T_i dS_i`` would cancel terms far larger than the result.

Every function takes the full (b, R, h, ...) tensors of :mod:`.ssd_quadratic` and the ``wide``
mask, and adds the wide heads' share in place. With the native kernels, :func:`add_forward` and
:func:`add_backward` are one call each (:func:`.native_cpu.wide_forward`), which takes the
factors at the floor as zero and skips the parts of a token block's products where all of
them sit there (less than 1e-26 relative either way).
"""
import torch
from torch import Tensor
from torch.profiler import record_function

from . import native_cpu
from ..reference import exp_decay
from .ssd_triangles import block_bounds, native_blocks

__all__ = ['cumulative', 'add_forward', 'add_saved', 'add_backward']


def cumulative(a: Tensor) -> Tensor:
    """Inclusive cumulative sum over tokens (b, R, h, L), in float64; reverse (``S_i =
    sum_{k >= i} a_k``) for the anti-causal direction ``R = 1``."""
    a = a.double()
    S = a.cumsum(-1)
    if S.shape[1] == 2:
        S[:, 1] = S[:, 1, :, -1:] - S[:, 1] + a[:, 1]
    return S


def _split(S: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor | None]:
    """``hi`` (``S`` rounded to ``dtype``) and ``lo = S - hi`` (None in float64)."""
    hi = S.to(dtype)
    return hi, None if dtype == torch.float64 else (S - hi.double()).to(dtype)


def _mask(t: Tensor, direction: int) -> Tensor:
    """Strict lower (direction 0) or upper (1) triangle of ``t`` (..., L, L), in place."""
    return t.tril_(-1) if direction == 0 else t.triu_(1)


def _subsets(wide: Tensor, groups: int):
    """Per direction with wide heads: (direction, sample index, head index, group index)."""
    heads = wide.shape[2]
    for r in range(wide.shape[1]):
        b_idx, h_idx = wide[:, r].nonzero(as_tuple=True)
        if b_idx.numel():
            yield r, b_idx, h_idx, h_idx // (heads // groups)


def _heads(t: Tensor, r: int, b_idx: Tensor, h_idx: Tensor) -> Tensor:
    """Indices of ``t[b_idx, r, h_idx]`` in ``t`` (b, R, h, ...) viewed as (-1, ...), sorted
    when the subset comes in the order of ``nonzero`` (also for the group matrices ``cb``
    (b, R, g, L, L) with group indices)."""
    return (b_idx * t.shape[1] + r) * t.shape[2] + h_idx


def _take(t: Tensor, r: int, b_idx: Tensor, h_idx: Tensor) -> Tensor:
    """``t[b_idx, r, h_idx]`` of ``t`` (b, R, h, ...) (an ``index_select`` of the flattened
    tensor when it is contiguous: CPU advanced indexing is several times slower)."""
    if not t.is_contiguous():
        return t[b_idx, r, h_idx]
    return t.view(-1, *t.shape[3:]).index_select(0, _heads(t, r, b_idx, h_idx))


def _add_at(t: Tensor, r: int, b_idx: Tensor, h_idx: Tensor, v: Tensor) -> None:
    """``t[b_idx, r, h_idx] += v`` in place (an ``index_add_`` when ``t`` is contiguous)."""
    if t.is_contiguous():
        t.view(-1, *t.shape[3:]).index_add_(0, _heads(t, r, b_idx, h_idx), v)
    else:
        t[b_idx, r, h_idx] += v


def _matrices(x, dt, S, r, b_idx, h_idx) -> dict:
    """The subset's scanned values ``xs = x scale`` (N, p, L) with ``scale = dt / el`` (N, L),
    row scales ``el`` (N, L) or None (then ``scale = dt``) and cumulative decay ``hi`` (N, L)."""
    hi, lo = _split(_take(S, r, b_idx, h_idx), x.dtype)
    el = None if lo is None else lo.exp()
    dts = _take(dt, r, b_idx, h_idx)
    scale = dts if el is None else dts / el
    xs = _take(x, r, b_idx, h_idx).mul_(scale.unsqueeze(-2))
    return dict(xs=xs, el=el, hi=hi, scale=scale)


def _blocks(native: bool, *tensors: Tensor) -> list[int] | None:
    """The token blocks of :mod:`.ssd_triangles` if the subset's (N, ., L) products run in the
    native kernels (:func:`.ssd_triangles.native_blocks` of them as (N, 1, 1, ., L)), else
    None."""
    bounds = block_bounds(tensors[0].shape[-1])
    return bounds if native_blocks(native, bounds, *[t[:, None, None] for t in tensors]) else None


def _product(a: Tensor, w: Tensor, bounds: list[int], transpose: bool,
             lower: bool) -> Tensor:
    """``a @ w`` (``transpose``: ``a @ w^T``) of (N, p, L) and the strictly ``lower`` (else
    upper) triangular (N, L, L) weights, their zero blocks skipped
    (:func:`.native_cpu.column_products`)."""
    # column block j of op(w) reads rows [0, j1) when op(w) is upper triangular
    prefix = lower == transpose
    out = native_cpu.column_products(a[:, None, None], w[:, None, None], bounds, transpose,
                                     prefix_first=prefix)
    return out.view(a.shape)


def _decay(hi: Tensor) -> Tensor:
    """``E = exp(clamp(hi_i - hi_j, -60, 0))`` (N, L, L)."""
    return exp_decay(hi[..., :, None] - hi[..., None, :])


def _fused(native: bool, S: Tensor, planes: list[Tensor], flat: list[Tensor]) -> bool:
    """Whether the wide heads run as one native call each way (:func:`.native_cpu.wide_forward`,
    :func:`.native_cpu.wide_backward`): asked to (``native``), operands as
    :func:`.native_cpu.fused_fit` says and a contiguous float64 ``S``."""
    return (native and native_cpu.fused_fit(planes, flat)
            and S.is_contiguous())


@record_function('bidir_ssd.scan.wide_heads')
def add_forward(y: Tensor, x: Tensor, dt: Tensor, S: Tensor, cb: Tensor,
                wide: Tensor, native: bool = False) -> Tensor:
    """``y += W x`` (times ``dt``) for the wide heads (y, x: (b, R, h, p, L)); returns the
    added parts (N, p, L) in the order of :func:`add_saved` (N wide heads). ``native``: the
    native CPU kernels (:mod:`.native_cpu`), all in one call where the operands suit it."""
    if _fused(native, S, [x, y], [dt, cb]):
        return native_cpu.wide_forward(x, dt, S, cb, wide.contiguous(),
                                       block_bounds(x.shape[-1]), y)
    parts, cbs = [], cb.view(-1, *cb.shape[-2:])
    for r, b_idx, h_idx, g_idx in _subsets(wide, cb.shape[2]):
        m = _matrices(x, dt, S, r, b_idx, h_idx)
        flat = _heads(cb, r, b_idx, g_idx)
        bounds = _blocks(native, m['xs'])
        if bounds is not None:  # W's zero blocks skipped
            W = native_cpu.wide_weights(m['hi'], cbs, flat, r, transpose=False)
            ys = _product(m['xs'], W, bounds, transpose=True, lower=r == 0)
        else:
            if native:
                wt = native_cpu.wide_weights(m['hi'], cbs, flat, r, transpose=True)
            else:
                wt = (_decay(m['hi']) * cbs.index_select(0, flat)).transpose(-1, -2).contiguous()
            ys = torch.matmul(m['xs'], wt)
        if m['el'] is not None:
            ys.mul_(m['el'].unsqueeze(-2))
        _add_at(y, r, b_idx, h_idx, ys)
        parts.append(ys)
    return torch.cat(parts)


def add_saved(y: Tensor, parts: Tensor, wide: Tensor) -> None:
    """``y += parts`` at the wide heads: replays :func:`add_forward` from its result."""
    start = 0
    for r in range(wide.shape[1]):
        b_idx, h_idx = wide[:, r].nonzero(as_tuple=True)
        _add_at(y, r, b_idx, h_idx, parts[start:start + b_idx.numel()])
        start += b_idx.numel()


@record_function('bidir_ssd.scan.wide_heads')
def add_backward(dy: Tensor, x: Tensor, dt: Tensor, S: Tensor, cb: Tensor, wide: Tensor,
                 dx: Tensor, ddt: Tensor, dS: Tensor, dcb: Tensor,
                 native: bool = False) -> Tensor:
    """Adds the wide heads' gradients to ``dx``, ``ddt`` (their direct ``dt`` factor), ``dS``
    and ``dcb`` in place; returns their ``dA`` (R, h) in float64 (zero for other heads).
    ``native``: the element-wise (L, L) work in the native CPU kernels (:mod:`.native_cpu`),
    everything in one call where the operands suit it."""
    if _fused(native, S, [dy, x, dx], [dt, cb, ddt, dS, dcb]):
        return native_cpu.wide_backward(dy, x, dt, S, cb, wide.contiguous(),
                                        block_bounds(x.shape[-1]), dx, ddt, dS, dcb)
    dA = torch.zeros(wide.shape[1:], dtype=torch.float64, device=dy.device)
    T = cumulative(dt)
    cbs, dcbs = cb.view(-1, *cb.shape[-2:]), dcb.view(-1, *dcb.shape[-2:])
    for r, b_idx, h_idx, g_idx in _subsets(wide, cb.shape[2]):
        m = _matrices(x, dt, S, r, b_idx, h_idx)
        el = m['el']
        flat = _heads(cb, r, b_idx, g_idx)
        if native:
            W = native_cpu.wide_weights(m['hi'], cbs, flat, r, transpose=False)
        else:
            E = _decay(m['hi'])
            W = E * cbs.index_select(0, flat)
        dys = _take(dy, r, b_idx, h_idx)
        dys = dys if el is None else dys.mul_(el.unsqueeze(-2))
        bounds = _blocks(native, dys, m['xs'])
        if bounds is not None:  # W's and dW's zero blocks skipped
            dxs = _product(dys, W, bounds, transpose=False, lower=r == 0)
            dW = native_cpu.masked_outer(dys[:, None, None], m['xs'][:, None, None], bounds,
                                         first_lower=r == 0)[0].view(W.shape)
        else:
            dxs = torch.matmul(dys, W)
            dW = torch.matmul(dys.transpose(-1, -2), m['xs'])
        _add_at(dx, r, b_idx, h_idx, dxs * m['scale'].unsqueeze(-2))
        ddt_direct = (dxs.mul_(_take(x, r, b_idx, h_idx))).sum(-2)
        _add_at(ddt, r, b_idx, h_idx, ddt_direct if el is None else ddt_direct / el)
        t_hi, t_lo = _split(_take(T, r, b_idx, h_idx), x.dtype)
        if native:
            dS_sub, pairs = native_cpu.wide_grads(dW, m['hi'], t_hi, cbs, flat, r, dcbs)
        else:
            # heads of one group and sample add to the same dcb matrix: index_add_ over the
            # flattened (b, R, g) matrices (a CPU index_put_ with accumulate=True is several
            # times slower)
            dcbs.index_add_(0, flat, _mask(E.mul_(dW), r))
            G = dW.mul_(W)
            dS_sub = G.sum(-1).sub_(G.sum(-2))
            # sum_ij G_ij (T_i - T_j) pair by pair (an einsum here runs as a batch of
            # (1 x L^2) @ (L^2 x 1) products, 10x slower on CPU)
            pairs = (t_hi[:, :, None] - t_hi[:, None, :]).mul_(G).sum((-2, -1)).double()
        _add_at(dS, r, b_idx, h_idx, dS_sub)
        if t_lo is not None:
            pairs += (t_lo * dS_sub).sum(-1).double()
        dA[r].index_add_(0, h_idx, pairs)
    return dA
