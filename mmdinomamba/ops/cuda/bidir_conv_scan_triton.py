"""CUDA path of :func:`mmdinomamba.ops.bidir_conv_scan`: our fused bidirectional conv kernel and
``mamba_ssm``'s SSD forward / backward as the op ``mmdinomamba::bidir_conv_scan`` (a fake
implementation; its backward, the op ``mmdinomamba::bidir_conv_scan_backward``, recomputes the
conv instead of keeping it: autograd keeps the inputs and the scan output).

Imported only on first CUDA use (``_triton.conv_scan_fn``). Uses two functions of
``mamba_ssm.ops.triton.ssd_combined`` (2.3.2.post1) that its own fused Mamba-2 path uses:
``_mamba_chunk_scan_combined_fwd`` and ``_mamba_chunk_scan_combined_bwd`` (the latter writes the
gradients of ``x``, ``B``, ``C`` into given views, so they land in one conv-gradient buffer
without a concatenation), with the chunk fitted to short sequences (:func:`._triton.fitted_chunk`).
A ``self_check`` against the composition runs before first use. The op is registered for every
device: tested on CPU tensors through Triton's interpreter (``tests/kernel_interpreter.py``).
"""
import torch
from torch import Tensor

from ._triton import fitted_chunk, import_mamba_module
from .bidir_conv_triton import conv_bwd, conv_fwd
from ..reference.mixer import split_conv_output as _views

__all__ = ['bidir_conv_scan', 'self_check']

_ssd = import_mamba_module('mamba_ssm.ops.triton.ssd_combined')
_scan_fwd, _scan_bwd = _ssd._mamba_chunk_scan_combined_fwd, _ssd._mamba_chunk_scan_combined_bwd


@torch.library.custom_op('mmdinomamba::bidir_conv_scan', mutates_args=())
def _conv_scan(xBC: Tensor, weight: Tensor, bias: Tensor | None, dt: Tensor, dt_bias: Tensor,
               A: Tensor, D: Tensor, splits: list[int], headdim: int, d_state: int,
               chunk_size: int) -> Tensor:
    u, Bm, Cm = _views(conv_fwd(xBC, weight, bias, splits, True), splits, headdim, d_state)
    return _scan_fwd(u, dt, A, Bm, Cm, fitted_chunk(xBC.shape[1], chunk_size), D=D,
                     dt_bias=dt_bias, dt_softplus=True)[0]  # the conv output is freed here


@_conv_scan.register_fake
def _conv_scan_fake(xBC, weight, bias, dt, dt_bias, A, D, splits, headdim, d_state, chunk_size):
    return xBC.new_empty(*xBC.shape[:2], dt.shape[-1], headdim)


@torch.library.custom_op('mmdinomamba::bidir_conv_scan_backward', mutates_args=())
def _conv_scan_backward(dout: Tensor, out: Tensor, xBC: Tensor, weight: Tensor,
                        bias: Tensor | None, dt: Tensor, dt_bias: Tensor, A: Tensor, D: Tensor,
                        splits: list[int], headdim: int, d_state: int,
                        chunk_size: int) -> list[Tensor]:
    conv = conv_fwd(xBC, weight, bias, splits, True)  # recomputed
    u, Bm, Cm = _views(conv, splits, headdim, d_state)
    dconv = torch.empty_like(conv)
    du, dB, dC = _views(dconv, splits, headdim, d_state)
    _, ddt, dA, _, _, dD, _, ddt_bias, _ = _scan_bwd(
        dout.contiguous(), u, dt, A, Bm, Cm, out, fitted_chunk(xBC.shape[1], chunk_size), D=D,
        dt_bias=dt_bias, dt_softplus=True, dx=du, ddt=torch.empty_like(dt), dB=dB, dC=dC)
    del conv, u, Bm, Cm
    dxBC, dweight, dbias = conv_bwd(xBC, weight, bias, dconv, splits, True)
    return [dxBC, dweight, xBC.new_empty(0) if dbias is None else dbias, ddt,
            ddt_bias.to(dt_bias.dtype), dA.to(A.dtype), dD.to(D.dtype)]


@_conv_scan_backward.register_fake
def _conv_scan_backward_fake(dout, out, xBC, weight, bias, *rest):
    return [xBC.new_empty(xBC.shape)] + [
        xBC.new_empty(0) if t is None else torch.empty_like(t) for t in (weight, bias, *rest[:4])]


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:7], output)  # the inputs and the scan output, no conv output
    ctx.sizes = inputs[7:]


def _backward(ctx, dout):
    *inputs, out = ctx.saved_tensors
    grads = _conv_scan_backward(dout, out, *inputs, *ctx.sizes)
    return (*(None if t is None else g for t, g in zip(inputs, grads)), None, None, None, None)


_conv_scan.register_autograd(_backward, setup_context=_setup_context)


def bidir_conv_scan(xBC, weight, bias, dt, dt_bias, A, D, splits, headdim, d_state, chunk_size):
    """See :func:`mmdinomamba.ops.bidir_conv_scan` (the ``mmdinomamba::bidir_conv_scan`` op)."""
    return _conv_scan(xBC, weight, bias, dt, dt_bias, A, D, list(splits), int(headdim),
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
