"""The chunked SSD scan in the native CPU kernels (the kernel ``chunk_scan_forward``):
Mamba-2's block decomposition of :mod:`mmdinomamba.ops.reference.ssd_chunked`, one work unit per
(sample, group, slice of the group's heads) running the whole sequence chunk by chunk with every
temporary in cache, and a hand-written backward pass that recomputes from the inputs and the
states kept at the chunk starts."""
import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..reference.ssd_ref import ssd_scan_ref
from ..self_check import mismatch, reference_graph
from . import native_cpu
from .native_cpu import kernels

__all__ = ['ssd_scan_chunked_native']


class _NativeChunkedSSD(torch.autograd.Function):
    """Saves the inputs and the states entering each chunk (in pieces of at most 16 MiB,
    ``csrc/chunk_scan.h``); the backward kernel recomputes the rest."""

    @staticmethod
    def forward(ctx, x, dt, A, B, C, D, Q):
        y, states = kernels().chunk_scan_forward(x, dt, A, B, C, D, Q,
                                                 any(ctx.needs_input_grad))
        ctx.save_for_backward(x, dt, A, B, C, D, *states)
        ctx.Q = Q
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, dt, A, B, C, D, *states = ctx.saved_tensors
        dx, ddt, dA, dB, dC, dD = kernels().chunk_scan_backward(dy.contiguous(), x, dt, A, B, C,
                                                                D, list(states), ctx.Q)
        return dx, ddt, dA, dB, dC, None if D is None else dD, None


@native_cpu.register_self_check
def _native_self_check() -> str | None:
    """One small float32 scan (two groups, several chunks and a ragged one, a strongly decaying
    head) forward and backward in the native kernels, against the float64 recurrence
    :func:`~mmdinomamba.ops.reference.ssd_scan_ref`; returns what differs by more than
    ``native_cpu.SELF_CHECK_TOL``, or None."""
    gen = torch.Generator().manual_seed(0)
    b, length, h, p, g, n, Q = 2, 45, 4, 8, 2, 8, 8
    x, dy = (torch.randn(b, length, h, p, generator=gen) for _ in range(2))
    dt = torch.rand(b, length, h, generator=gen) / 4
    dt[..., 0] *= 100  # decays by about 50 per token
    A = -torch.tensor([4., 1., 2., 8.])
    B, C = (torch.randn(b, length, g, n, generator=gen) for _ in range(2))
    D = torch.randn(h, generator=gen)
    with torch.no_grad(), torch.autocast('cpu', enabled=False):
        y, states = kernels().chunk_scan_forward(x, dt, A, B, C, D, Q, True)
        got = [y, *kernels().chunk_scan_backward(dy, x, dt, A, B, C, D, states, Q)]
    with reference_graph():
        ins = [t.double().requires_grad_() for t in (x, dt, A, B, C, D)]
        y_ref = ssd_scan_ref(*ins)
        want = [y_ref.detach(), *torch.autograd.grad(y_ref, ins, dy.double())]
    error = mismatch(['output', 'dx', 'ddt', 'dA', 'dB', 'dC', 'dD'], got, want,
                     native_cpu.SELF_CHECK_TOL)
    return None if error is None else f'chunked scan {error} against the reference'


def ssd_scan_chunked_native(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                            D: Tensor | None, chunk_size: int) -> Tensor:
    """:func:`~mmdinomamba.ops.reference.ssd_scan_chunked` of float32 / float64 CPU tensors (one
    dtype, made contiguous here) in the native kernels."""
    x, dt, A, B, C = (t.contiguous() for t in (x, dt, A, B, C))
    D = None if D is None else D.contiguous()
    Q = max(1, min(chunk_size, x.shape[1]))
    with torch.autocast(device_type='cpu', enabled=False):
        return _NativeChunkedSSD.apply(x, dt, A, B, C, D, Q)
