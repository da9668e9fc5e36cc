"""The blocks' RMSNorm in the native CPU kernels: one pass per row each way (PyTorch's CPU
backward of ``F.rms_norm`` is a composition of about ten operations)."""
import torch
from torch import Tensor

from .native_cpu import kernels

__all__ = ['rms_norm_native']


class _RMSNorm(torch.autograd.Function):
    """:func:`rms_norm` in the native kernels; keeps ``x`` and the per-row ``rstd``. Not twice
    differentiable."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        x = x.contiguous()
        weight = None if weight is None else weight.contiguous()
        y, rstd = kernels().rms_norm_forward(x, weight, eps)
        ctx.save_for_backward(x, rstd, weight)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, rstd, weight = ctx.saved_tensors
        dx, *dweight = kernels().rms_norm_backward(grad.contiguous(), x, rstd, weight)
        return dx, dweight[0] if weight is not None else None, None


def rms_norm_native(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """``F.rms_norm`` over the last dimension of a float32 / float64 CPU ``x`` (``weight`` of
    its dtype or None) in the native kernels."""
    return _RMSNorm.apply(x, weight, eps)
