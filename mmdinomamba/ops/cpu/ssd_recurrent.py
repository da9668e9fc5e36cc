"""The SSD scan by its recurrence, in the native CPU kernels, for heads of 16 channels with 16
states (the demo-sized models').

A head's state (16 x 16 values) fits in vector registers, so the recurrence

    h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t^T,    y_t = C_t^T h_t + D x_t

costs two vector multiply-adds per state and token, and no (L, L) matrix is built: at the
demo's 65 and 17 tokens it is several times faster than the quadratic form
(:mod:`.ssd_quadratic`), whose many small matrix products cost more than their work. The
backward pass recomputes a head's states (nothing but the inputs is kept) and runs the
reverse recurrence of their gradient; the decay's gradient is taken from the states directly
(``dL/da_t = sum <G_t, h_{t-1}>``), as exact as the sequential reference.

The bidirectional mixer's CPU fast path calls the kernels on its channel-major layout
(:mod:`.bidir_inner`); :func:`ssd_scan_recurrent`
is the same scan in the layout of :func:`~mmdinomamba.ops.ssd_scan`, for tests and direct use.
"""
import torch
from torch import Tensor

from . import native_cpu

__all__ = ['ssd_scan_recurrent']


def _channel_major(t: Tensor) -> Tensor:
    """(b, L, h, p) -> (b, 1, h, p, L), contiguous."""
    return t.permute(0, 2, 3, 1).unsqueeze(1).contiguous()


class _RecurrentSSD(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, dt, A, B, C, D):
        args = (_channel_major(x), dt.transpose(1, 2).unsqueeze(1).contiguous(), A[None],
                _channel_major(B), _channel_major(C), None if D is None else D[None])
        ctx.save_for_backward(*args[:5], D)
        return native_cpu.recurrent_scan_forward(*args).squeeze(1).permute(0, 3, 1, 2)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, dt, A, B, C, D = ctx.saved_tensors
        dx, ddt, dA, dB, dC, dD = native_cpu.recurrent_scan_backward(
            _channel_major(dy), x, dt, A, B, C, None if D is None else D[None])
        return (dx.squeeze(1).permute(0, 3, 1, 2), ddt.squeeze(1).transpose(1, 2), dA[0],
                dB.squeeze(1).permute(0, 3, 1, 2), dC.squeeze(1).permute(0, 3, 1, 2),
                None if D is None else dD[0])


def ssd_scan_recurrent(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                       D: Tensor | None = None) -> Tensor:
    """Causal SSD scan by its recurrence in the native CPU kernels; exact to
    :func:`~mmdinomamba.ops.ssd_scan_ref` up to rounding.

    Args:
        x (Tensor): (batch, length, heads, 16) float32 or float64 CPU tensor.
        dt (Tensor): (batch, length, heads) positive step sizes.
        A (Tensor): (heads,) negative decay rates.
        B (Tensor): (batch, length, groups, 16).
        C (Tensor): (batch, length, groups, 16).
        D (Tensor, optional): (heads,) skip weights. Defaults to None.

    Returns:
        Tensor: (batch, length, heads, 16).

    Raises:
        ValueError: other head sizes, dtypes or devices, or no native kernels on this machine
            (:func:`~mmdinomamba.ops.native_cpu.load_error` says why).
    """
    if x.dim() != 4 or B.dim() != 4 or not native_cpu.recurrent_fits(B.shape[-1], x.shape[-1]):
        raise ValueError(f'ssd_scan_recurrent: heads of {native_cpu.RECURRENT_HEADS[1]} channels '
                         f'with {native_cpu.RECURRENT_HEADS[0]} states only, got x '
                         f'{tuple(x.shape)} and B {tuple(B.shape)}')
    if x.device.type != 'cpu' or x.dtype not in (torch.float32, torch.float64):
        raise ValueError(f'ssd_scan_recurrent: float32 or float64 CPU tensors only, got '
                         f'{x.dtype} on {x.device}')
    if not native_cpu.available():
        raise ValueError(f'ssd_scan_recurrent: the native CPU kernels are not available '
                         f'({native_cpu.load_error()})')
    args = [None if t is None else t.to(x.dtype) for t in (x, dt, A, B, C, D)]
    return _RecurrentSSD.apply(*args)
