"""CUDA path of :func:`mmdinomamba.ops.bidir_conv_scan`: our fused bidirectional conv kernel and
``mamba_ssm``'s SSD forward / backward in one autograd function that recomputes the conv.

Imported only on first CUDA use (``_triton.conv_scan_fn``). Uses two functions of
``mamba_ssm.ops.triton.ssd_combined`` (2.3.2.post1) that its own fused Mamba-2 path uses:
``_mamba_chunk_scan_combined_fwd`` and ``_mamba_chunk_scan_combined_bwd`` (the latter writes the
gradients of ``x``, ``B``, ``C`` into given views, so they land in one conv-gradient buffer
without a concatenation). A ``self_check`` against the composition runs before first use.
Tested on CPU through Triton's interpreter (``tests/kernel_interpreter.py``).
"""
import torch

from . import bidir_conv_triton
from ._triton import import_mamba_module
from ..reference.mixer import split_conv_output as _views

__all__ = ['bidir_conv_scan', 'self_check']

_ssd = import_mamba_module('mamba_ssm.ops.triton.ssd_combined')
_scan_fwd, _scan_bwd = _ssd._mamba_chunk_scan_combined_fwd, _ssd._mamba_chunk_scan_combined_bwd


class _BidirConvScan(torch.autograd.Function):

    @staticmethod
    def forward(ctx, xBC, weight, bias, dt, dt_bias, A, D, splits, headdim, d_state, chunk_size):
        conv = bidir_conv_triton.conv_fwd(xBC, weight, bias, splits, True)
        u, Bm, Cm = _views(conv, splits, headdim, d_state)
        out = _scan_fwd(u, dt, A, Bm, Cm, chunk_size, D=D, dt_bias=dt_bias, dt_softplus=True)[0]
        ctx.save_for_backward(xBC, weight, bias, dt, dt_bias, A, D, out)
        ctx.meta = (splits, headdim, d_state, chunk_size)
        return out  # the conv output is freed here; backward recomputes it

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        xBC, weight, bias, dt, dt_bias, A, D, out = ctx.saved_tensors
        splits, headdim, d_state, chunk_size = ctx.meta
        conv = bidir_conv_triton.conv_fwd(xBC, weight, bias, splits, True)
        u, Bm, Cm = _views(conv, splits, headdim, d_state)
        dconv = torch.empty_like(conv)
        du, dB, dC = _views(dconv, splits, headdim, d_state)
        ddt = torch.empty_like(dt)
        _, ddt, dA, _, _, dD, _, ddt_bias, _ = _scan_bwd(
            dout.contiguous(), u, dt, A, Bm, Cm, out, chunk_size, D=D, dt_bias=dt_bias,
            dt_softplus=True, dx=du, ddt=ddt, dB=dB, dC=dC)
        del conv, u, Bm, Cm
        dxBC, dweight, dbias = bidir_conv_triton.conv_bwd(xBC, weight, bias, dconv, splits, True)
        return (dxBC, dweight, dbias, ddt, ddt_bias.to(dt_bias.dtype), dA.to(A.dtype),
                dD.to(D.dtype), None, None, None, None)


def bidir_conv_scan(xBC, weight, bias, dt, dt_bias, A, D, splits, headdim, d_state, chunk_size):
    """See :func:`mmdinomamba.ops.bidir_conv_scan`."""
    return _BidirConvScan.apply(xBC, weight, bias, dt, dt_bias, A, D, tuple(splits), int(headdim),
                                int(d_state), int(chunk_size))


def self_check(device='cuda') -> None:
    """Forward and backward once on a small float32 input against the composition (our conv
    kernel, then ``mamba_chunk_scan_combined``); raises if anything disagrees (1e-3: the
    scan's float32 matmuls may use TF32 on a GPU)."""
    from ._triton import compare_with_reference
    from ..bidir_conv_scan import bidir_conv_scan_composed
    gen = torch.Generator().manual_seed(0)
    B, L, h, p, n = 1, 21, 2, 8, 8  # one group per direction, two chunks of 16
    splits = (h * p, n, n)
    C = sum(splits)
    shapes = ((B, L, C), (2, C, 4), (2, C), (B, L, 2 * h), (2 * h, ), (2 * h, ), (2 * h, ))
    inputs = [torch.randn(*s, generator=gen).to(device) for s in shapes]
    inputs[5] = -inputs[5].abs() - 0.5  # A < 0
    go = torch.randn(B, L, 2 * h, p, generator=gen).to(device)
    compare_with_reference('fused conv + scan', lambda *a: bidir_conv_scan(*a, splits, p, n, 16),
                           lambda *a: bidir_conv_scan_composed(*a, splits, p, n, 16), inputs, go,
                           ('y', 'dxBC', 'dweight', 'dbias', 'ddt', 'ddt_bias', 'dA', 'dD'), 1e-3)
