"""Triton kernels of :func:`mmdinomamba.ops.bidir_gated_merge` (forward and backward).

The op ``mmdinomamba::bidir_gated_merge`` (also returns the rstd that its backward op reads) and
``mmdinomamba::bidir_gated_merge_backward``, imported only on first CUDA use
(``_triton.bidir_merge_fn``). Registered for every device: tested on CPU tensors through
Triton's interpreter against the reference (``tests/test_ops/``), on a GPU by ``gpu`` tests.

One program per (row, group) in the forward, where row ``r = b L + t``; the backward direction
of row ``r`` is read at ``b L + (L - 1 - t)`` in channels ``[d, 2d)``. With ``s = silu(z)``,
``h = y s``, ``n = h rstd`` per group, the output is ``(n_f w_f + n_b w_b) / 2``. Backward, per
direction: ``dn = g w / 2``, ``dh = rstd (dn - n mean(dn n))``, ``dy = dh s``,
``dz = (dh_f y_f + dh_b y_b) silu'(z)``, ``dw = sum_rows g n / 2``; without the norm,
``dy_f = dy_b = g s / 2`` and ``dz = g (y_f + y_b) silu'(z) / 2``.
"""
import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ['bidir_gated_merge', 'self_check']


@triton.jit
def _load_row(y_ptr, z_ptr, b, t, L, D, cols, mask, syb, syl, szb, szl):
    """float32 (y_f, y_b, z) of token ``t`` in batch ``b`` (y_b read at the flipped time)."""
    yf = tl.load(y_ptr + b * syb + t * syl + cols, mask=mask, other=0.).to(tl.float32)
    yb = tl.load(y_ptr + b * syb + (L - 1 - t) * syl + D + cols, mask=mask,
                 other=0.).to(tl.float32)
    z = tl.load(z_ptr + b * szb + t * szl + cols, mask=mask, other=0.).to(tl.float32)
    return yf, yb, z


@triton.jit
def _fwd_kernel(y_ptr, z_ptr, w_ptr, out_ptr, rstd_ptr, L, D, G, NG, eps, syb, syl, szb, szl,
                sob, sol, NORM: tl.constexpr, BLOCK: tl.constexpr):
    row, grp = tl.program_id(0).to(tl.int64), tl.program_id(1)
    b, t = row // L, row % L
    offs = tl.arange(0, BLOCK)
    mask = offs < G
    cols = grp * G + offs
    yf, yb, z = _load_row(y_ptr, z_ptr, b, t, L, D, cols, mask, syb, syl, szb, szl)
    s = z * tl.sigmoid(z)
    if NORM:
        hf, hb = yf * s, yb * s
        rf = 1. / tl.sqrt(tl.sum(hf * hf, axis=0) / G + eps)
        rb = 1. / tl.sqrt(tl.sum(hb * hb, axis=0) / G + eps)
        wf = tl.load(w_ptr + cols, mask=mask, other=0.).to(tl.float32)
        wb = tl.load(w_ptr + D + cols, mask=mask, other=0.).to(tl.float32)
        out = (hf * rf * wf + hb * rb * wb) * 0.5
        tl.store(rstd_ptr + (row * NG + grp) * 2, rf)
        tl.store(rstd_ptr + (row * NG + grp) * 2 + 1, rb)
    else:
        out = (yf + yb) * s * 0.5
    tl.store(out_ptr + b * sob + t * sol + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_kernel(y_ptr, z_ptr, w_ptr, rstd_ptr, g_ptr, dy_ptr, dz_ptr, dw_ptr, L, D, G, NG,
                n_rows, rows_per_prog, syb, syl, szb, szl, sgb, sgl, sdyb, sdyl, sdzb, sdzl,
                NORM: tl.constexpr, BLOCK: tl.constexpr):
    """Rows ``[pid * rows_per_prog, ...)`` of one group; partial dweight sums into
    dw (n_prog, 2, D)."""
    pid, grp = tl.program_id(0), tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    mask = offs < G
    cols = grp * G + offs
    if NORM:
        wf = tl.load(w_ptr + cols, mask=mask, other=0.).to(tl.float32)
        wb = tl.load(w_ptr + D + cols, mask=mask, other=0.).to(tl.float32)
        dwf = tl.zeros((BLOCK, ), dtype=tl.float32)
        dwb = tl.zeros((BLOCK, ), dtype=tl.float32)
    row_start = pid.to(tl.int64) * rows_per_prog
    row_end = tl.minimum(row_start + rows_per_prog, n_rows)
    for row in range(row_start, row_end):
        b, t = row // L, row % L
        yf, yb, z = _load_row(y_ptr, z_ptr, b, t, L, D, cols, mask, syb, syl, szb, szl)
        g = tl.load(g_ptr + b * sgb + t * sgl + cols, mask=mask, other=0.).to(tl.float32) * 0.5
        sig = tl.sigmoid(z)
        s = z * sig
        dsilu = sig * (1. + z * (1. - sig))
        if NORM:
            rf = tl.load(rstd_ptr + (row * NG + grp) * 2)
            rb = tl.load(rstd_ptr + (row * NG + grp) * 2 + 1)
            nf, nb = yf * s * rf, yb * s * rb
            dnf, dnb = g * wf, g * wb
            dhf = rf * (dnf - nf * (tl.sum(dnf * nf, axis=0) / G))
            dhb = rb * (dnb - nb * (tl.sum(dnb * nb, axis=0) / G))
            dwf += g * nf
            dwb += g * nb
            dyf, dyb = dhf * s, dhb * s
            dz = (dhf * yf + dhb * yb) * dsilu
        else:
            dyf = g * s
            dyb = dyf
            dz = g * (yf + yb) * dsilu
        tl.store(dy_ptr + b * sdyb + t * sdyl + cols, dyf.to(dy_ptr.dtype.element_ty), mask=mask)
        tl.store(dy_ptr + b * sdyb + (L - 1 - t) * sdyl + D + cols,
                 dyb.to(dy_ptr.dtype.element_ty), mask=mask)
        tl.store(dz_ptr + b * sdzb + t * sdzl + cols, dz.to(dz_ptr.dtype.element_ty), mask=mask)
    if NORM:
        tl.store(dw_ptr + pid * 2 * D + cols, dwf, mask=mask)
        tl.store(dw_ptr + (pid * 2 + 1) * D + cols, dwb, mask=mask)


def _last_contiguous(t):
    return t if t.stride(-1) == 1 else t.contiguous()


def _launch_cfg(group_size: int, elt_size: int):
    block = triton.next_power_of_2(group_size)
    if block * elt_size > 65536:
        raise ValueError(f'bidir_gated_merge kernel: group_size {group_size} too large')
    return block, min(max(block // 256, 1), 8)


def _num_programs(device: torch.device, n_rows: int) -> int:
    if device.type == 'cuda':
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    else:  # the interpreter
        sms = 2
    return max(1, min(n_rows, 4 * sms))


@torch.library.custom_op('mmdinomamba::bidir_gated_merge', mutates_args=())
def _merge(y: Tensor, z: Tensor, weight: Tensor | None, eps: float,
           group_size: int) -> tuple[Tensor, Tensor]:
    y, z = _last_contiguous(y), _last_contiguous(z)
    B, L, D = z.shape
    ng, norm = D // group_size, weight is not None
    w = weight.contiguous() if norm else y  # dummy pointer without the norm
    out = torch.empty(B, L, D, device=y.device, dtype=y.dtype)
    rstd = (torch.empty if norm else torch.zeros)(B * L * ng * 2 if norm else 1,
                                                 device=y.device, dtype=torch.float32)
    block, warps = _launch_cfg(group_size, y.element_size())
    _fwd_kernel[(B * L, ng)](y, z, w, out, rstd, L, D, group_size, ng, eps, y.stride(0),
                             y.stride(1), z.stride(0), z.stride(1), out.stride(0),
                             out.stride(1), NORM=norm, BLOCK=block, num_warps=warps)
    return out, rstd


@_merge.register_fake
def _merge_fake(y, z, weight, eps, group_size):
    B, L, D = z.shape
    n = B * L * (D // group_size) * 2 if weight is not None else 1
    return y.new_empty(B, L, D), y.new_empty(n, dtype=torch.float32)


@torch.library.custom_op('mmdinomamba::bidir_gated_merge_backward', mutates_args=())
def _merge_backward(grad_out: Tensor, y: Tensor, z: Tensor, weight: Tensor | None, rstd: Tensor,
                    group_size: int) -> list[Tensor]:
    y, z, g = _last_contiguous(y), _last_contiguous(z), _last_contiguous(grad_out)
    B, L, D = z.shape
    ng, n_rows, norm = D // group_size, B * L, weight is not None
    n_prog = _num_programs(y.device, n_rows)
    rows_per_prog = triton.cdiv(n_rows, n_prog)
    dy = torch.empty(B, L, 2 * D, device=y.device, dtype=y.dtype)
    dz = torch.empty(B, L, D, device=z.device, dtype=z.dtype)
    dw = torch.empty(n_prog if norm else 1, 2, D, device=y.device, dtype=torch.float32)
    w = weight.contiguous() if norm else y
    block, warps = _launch_cfg(group_size, y.element_size())
    _bwd_kernel[(n_prog, ng)](y, z, w, rstd, g, dy, dz, dw, L, D, group_size, ng, n_rows,
                              rows_per_prog, y.stride(0), y.stride(1), z.stride(0),
                              z.stride(1), g.stride(0), g.stride(1), dy.stride(0),
                              dy.stride(1), dz.stride(0), dz.stride(1), NORM=norm,
                              BLOCK=block, num_warps=warps)
    return [dy, dz, dw.sum(0).to(weight.dtype) if norm else y.new_empty(0)]


@_merge_backward.register_fake
def _merge_backward_fake(grad_out, y, z, weight, rstd, group_size):
    return [y.new_empty(y.shape), z.new_empty(z.shape),
            y.new_empty(0) if weight is None else weight.new_empty(weight.shape)]


def _setup_context(ctx, inputs, output):
    y, z, weight, _, ctx.group_size = inputs
    ctx.save_for_backward(y, z, weight, output[1])
    ctx.mark_non_differentiable(output[1])


def _backward(ctx, grad_out, _):
    y, z, weight, rstd = ctx.saved_tensors
    dy, dz, dweight = _merge_backward(grad_out, y, z, weight, rstd, ctx.group_size)
    return dy, dz, None if weight is None else dweight, None, None


_merge.register_autograd(_backward, setup_context=_setup_context)


def bidir_gated_merge(y, z, weight, eps, group_size):
    """See :func:`mmdinomamba.ops.bidir_gated_merge` (arguments already checked; the
    ``mmdinomamba::bidir_gated_merge`` op, which also returns the rstd its backward uses)."""
    return _merge(y, z, weight, float(eps), int(group_size))[0]


def self_check(device='cuda') -> None:
    """Run forward and backward once on a small float32 input, with and without the norm, and
    compare with the reference; raises if the kernel does not compile or
    disagrees."""
    from ._triton import compare_with_reference
    from ..reference.norm import bidir_gated_merge_ref as bidir_gated_merge_portable
    gen = torch.Generator().manual_seed(0)
    y, z, w = (torch.randn(*s, generator=gen).to(device) for s in ((2, 7, 48), (2, 7, 24),
                                                                  (2, 24)))
    go = torch.randn(2, 7, 24, generator=gen).to(device)
    compare_with_reference('fused bidirectional merge (norm)',
                           lambda *a: bidir_gated_merge(*a, 1e-5, 12),
                           lambda *a: bidir_gated_merge_portable(*a, 1e-5, 12), [y, z, w], go,
                           ('out', 'dy', 'dz', 'dweight'), 1e-4)
    compare_with_reference('fused bidirectional merge (no norm)',
                           lambda *a: bidir_gated_merge(*a, None, 1e-5, 12),
                           lambda *a: bidir_gated_merge_portable(*a, None, 1e-5, 12), [y, z], go,
                           ('out', 'dy', 'dz'), 1e-4)
