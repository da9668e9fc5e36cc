"""Triton kernels of :func:`mmdinomamba.ops.bidir_causal_conv1d` (forward and backward).

Imported only on first CUDA use (``_triton.bidir_conv_fn``), never at package import. Tested on
CPU through Triton's interpreter (``TRITON_INTERPRET=1``) against the reference
(``tests/test_ops/test_bidir_conv.py``), and on a GPU by the ``gpu``-marked tests.

Index maps (``K`` taps, direction ``d``, output time ``t`` in the direction's own order):
``pre_d[t, c] = bias[d, c] + sum_k weight[d, c, k] * x[src_d(t - K + 1 + k), c]`` with
``src_0(s) = s``, ``src_1(s) = L - 1 - s`` and zero for ``s < 0``; the output channel of input
channel ``c`` in segment ``[lo, hi)`` is ``2 lo + d (hi - lo) + (c - lo)``.
"""
import torch
import triton
import triton.language as tl

__all__ = ['bidir_causal_conv', 'conv_fwd', 'conv_bwd', 'self_check']

BLOCK_L, BLOCK_C = 32, 64


@triton.jit
def _dest(offs_c, S1, S2, C, d):
    """Output channel of input channel ``offs_c`` for direction ``d`` (segments [0,S1),
    [S1,S2), [S2,C))."""
    lo = tl.where(offs_c < S1, 0, tl.where(offs_c < S2, S1, S2))
    hi = tl.where(offs_c < S1, S1, tl.where(offs_c < S2, S2, C))
    return 2 * lo + d * (hi - lo) + (offs_c - lo)


@triton.jit
def _tap(x_ptr, pid_b, offs_t, offs_c, mask_c, L, sxb, sxl, d: tl.constexpr, k: tl.constexpr,
         K: tl.constexpr):
    """(BL, BC) float32 inputs that tap ``k`` of direction ``d`` reads for output times
    ``offs_t`` (zero before the start of the direction's sequence and past ``L``)."""
    s = offs_t - (K - 1) + k
    ok = (s >= 0) & (offs_t < L)
    if d == 0:
        src = s
    else:
        src = L - 1 - s
    return tl.load(x_ptr + pid_b * sxb + src[:, None] * sxl + offs_c[None, :],
                   mask=ok[:, None] & mask_c[None, :], other=0.).to(tl.float32)


@triton.jit
def _pre(x_ptr, w_ptr, b_ptr, pid_b, offs_t, offs_c, mask_c, L, C, sxb, sxl,
         d: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr, BL: tl.constexpr,
         BC: tl.constexpr):
    """Pre-activation (BL, BC) of direction ``d`` at output times ``offs_t``."""
    acc = tl.zeros((BL, BC), dtype=tl.float32)
    for k in tl.static_range(K):
        xv = _tap(x_ptr, pid_b, offs_t, offs_c, mask_c, L, sxb, sxl, d, k, K)
        wv = tl.load(w_ptr + d * C * K + offs_c * K + k, mask=mask_c, other=0.)
        acc += xv * wv.to(tl.float32)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + d * C + offs_c, mask=mask_c, other=0.).to(tl.float32)[None, :]
    return acc


@triton.jit
def _fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, L, C, S1, S2, sxb, sxl, syb, syl,
                K: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
                BL: tl.constexpr, BC: tl.constexpr):
    pid_b, pid_l, pid_c = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    offs_t = pid_l * BL + tl.arange(0, BL)
    offs_c = pid_c * BC + tl.arange(0, BC)
    mask_c = offs_c < C
    mask = (offs_t < L)[:, None] & mask_c[None, :]
    for d in tl.static_range(2):
        acc = _pre(x_ptr, w_ptr, b_ptr, pid_b, offs_t, offs_c, mask_c, L, C, sxb, sxl,
                   d, K, HAS_BIAS, BL, BC)
        if ACT:
            acc = acc * tl.sigmoid(acc)
        dest = _dest(offs_c, S1, S2, C, d)
        tl.store(y_ptr + pid_b * syb + offs_t[:, None] * syl + dest[None, :],
                 acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_pre_kernel(x_ptr, w_ptr, b_ptr, dy_ptr, g_ptr, dw_ptr, db_ptr, L, C, S1, S2,
                    sxb, sxl, sdyb, sdyl, n_lblk,
                    K: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
                    BL: tl.constexpr, BC: tl.constexpr):
    """g = dy * act'(pre) into g (B, L, 2, C) float32; per-tile partial sums of dweight and
    dbias into dw (B * n_lblk, 2, C, K) and db (B * n_lblk, 2, C)."""
    pid_b, pid_l, pid_c = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    offs_t = pid_l * BL + tl.arange(0, BL)
    offs_c = pid_c * BC + tl.arange(0, BC)
    mask_c = offs_c < C
    mask_t = offs_t < L
    mask = mask_t[:, None] & mask_c[None, :]
    tile = pid_b * n_lblk + pid_l
    for d in tl.static_range(2):
        dest = _dest(offs_c, S1, S2, C, d)
        dy = tl.load(dy_ptr + pid_b * sdyb + offs_t[:, None] * sdyl + dest[None, :],
                     mask=mask, other=0.).to(tl.float32)
        if ACT:
            pre = _pre(x_ptr, w_ptr, b_ptr, pid_b, offs_t, offs_c, mask_c, L, C, sxb, sxl,
                       d, K, HAS_BIAS, BL, BC)
            sig = tl.sigmoid(pre)
            g = dy * sig * (1 + pre * (1 - sig))
        else:
            g = dy
        g = tl.where(mask, g, 0.)
        tl.store(g_ptr + ((pid_b * L + offs_t[:, None]) * 2 + d) * C + offs_c[None, :], g,
                 mask=mask)
        tl.store(db_ptr + (tile * 2 + d) * C + offs_c, tl.sum(g, axis=0), mask=mask_c)
        for k in tl.static_range(K):
            xv = _tap(x_ptr, pid_b, offs_t, offs_c, mask_c, L, sxb, sxl, d, k, K)
            tl.store(dw_ptr + ((tile * 2 + d) * C + offs_c) * K + k, tl.sum(g * xv, axis=0),
                     mask=mask_c)


@triton.jit
def _bwd_x_kernel(g_ptr, w_ptr, dx_ptr, L, C, sdxb, sdxl,
                  K: tl.constexpr, BL: tl.constexpr, BC: tl.constexpr):
    """dx[j] = sum_d sum_k w[d, k] * g_d[t_d(j, k)], t_0 = j + K-1-k, t_1 = L-1-j + K-1-k."""
    pid_b, pid_l, pid_c = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    offs_j = pid_l * BL + tl.arange(0, BL)
    offs_c = pid_c * BC + tl.arange(0, BC)
    mask_c = offs_c < C
    mask_j = offs_j < L
    acc = tl.zeros((BL, BC), dtype=tl.float32)
    for d in tl.static_range(2):
        for k in tl.static_range(K):
            if d == 0:
                t = offs_j + (K - 1) - k
            else:
                t = L - 1 - offs_j + (K - 1) - k
            ok = mask_j & (t < L)
            gv = tl.load(g_ptr + ((pid_b * L + t[:, None]) * 2 + d) * C + offs_c[None, :],
                         mask=ok[:, None] & mask_c[None, :], other=0.)
            wv = tl.load(w_ptr + d * C * K + offs_c * K + k, mask=mask_c, other=0.)
            acc += gv * wv.to(tl.float32)[None, :]
    tl.store(dx_ptr + pid_b * sdxb + offs_j[:, None] * sdxl + offs_c[None, :],
             acc.to(dx_ptr.dtype.element_ty), mask=mask_j[:, None] & mask_c[None, :])


def _bounds(splits, C):
    s1 = splits[0]
    s2 = s1 + splits[1] if len(splits) > 1 else C
    return s1, s2


def conv_fwd(x, weight, bias, splits, act):
    """Forward without autograd: (B, L, C) -> (B, L, 2C) (see ``bidir_causal_conv``)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    B, L, C = x.shape
    K = weight.shape[-1]
    w = weight.contiguous()
    b = bias.contiguous() if bias is not None else w  # dummy pointer when no bias
    y = torch.empty(B, L, 2 * C, device=x.device, dtype=x.dtype)
    s1, s2 = _bounds(splits, C)
    grid = (B, triton.cdiv(L, BLOCK_L), triton.cdiv(C, BLOCK_C))
    _fwd_kernel[grid](x, w, b, y, L, C, s1, s2, x.stride(0), x.stride(1), y.stride(0),
                      y.stride(1), K=K, HAS_BIAS=bias is not None, ACT=act, BL=BLOCK_L,
                      BC=BLOCK_C)
    return y


def conv_bwd(x, weight, bias, dy, splits, act):
    """Backward without autograd: -> (dx, dweight, dbias or None)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    B, L, C = x.shape
    K = weight.shape[-1]
    w = weight.contiguous()
    dy = dy.contiguous()
    s1, s2 = _bounds(splits, C)
    n_lblk = triton.cdiv(L, BLOCK_L)
    grid = (B, n_lblk, triton.cdiv(C, BLOCK_C))
    g = torch.empty(B, L, 2, C, device=x.device, dtype=torch.float32)
    dw = torch.empty(B * n_lblk, 2, C, K, device=x.device, dtype=torch.float32)
    db = torch.empty(B * n_lblk, 2, C, device=x.device, dtype=torch.float32)
    b = bias.contiguous() if bias is not None else w
    _bwd_pre_kernel[grid](x, w, b, dy, g, dw, db, L, C, s1, s2, x.stride(0), x.stride(1),
                          dy.stride(0), dy.stride(1), n_lblk, K=K, HAS_BIAS=bias is not None,
                          ACT=act, BL=BLOCK_L, BC=BLOCK_C)
    dx = torch.empty(B, L, C, device=x.device, dtype=x.dtype)
    _bwd_x_kernel[grid](g, w, dx, L, C, dx.stride(0), dx.stride(1), K=K, BL=BLOCK_L,
                        BC=BLOCK_C)
    dbias = None if bias is None else db.sum(0).to(bias.dtype)
    return dx, dw.sum(0).to(weight.dtype), dbias


class _BidirConv(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, weight, bias, splits, act):
        ctx.save_for_backward(x, weight, bias)
        ctx.splits, ctx.act = splits, act
        return conv_fwd(x, weight, bias, splits, act)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, weight, bias = ctx.saved_tensors
        return (*conv_bwd(x, weight, bias, dy, ctx.splits, ctx.act), None, None)


def bidir_causal_conv(x, weight, bias, splits, act):
    """See :func:`mmdinomamba.ops.bidir_causal_conv1d`; ``act``: apply SiLU."""
    return _BidirConv.apply(x, weight, bias, tuple(splits), bool(act))


def self_check(device='cuda') -> None:
    """Run forward and backward once on a small float32 input and compare with the
    reference; raises if the kernel does not compile or disagrees."""
    from ._triton import compare_with_reference
    from ..reference.conv import bidir_causal_conv1d_ref as bidir_causal_conv1d_portable
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(*s, generator=gen).to(device) for s in ((2, 37, 40), (2, 40, 4), (2, 40))]
    go = torch.randn(2, 37, 80, generator=gen).to(device)
    compare_with_reference(
        'fused bidirectional conv', lambda *a: bidir_causal_conv(*a, (24, 8, 8), True),
        lambda *a: bidir_causal_conv1d_portable(*a, (24, 8, 8), 'silu'), inputs, go,
        ('y', 'dx', 'dweight', 'dbias'), 1e-4)
