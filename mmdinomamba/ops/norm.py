"""Gated RMSNorm as used by Mamba-2 (``mamba_ssm``'s ``RMSNormGated``), in plain PyTorch, and
the blocks' plain RMSNorm with a native CPU forward and backward."""
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import _triton, native_cpu
from ._triton import rmsnorm_fn

__all__ = ['gated_rms_norm', 'rms_norm', 'RMSNorm']


def rms_norm(x: Tensor, weight: Tensor | None, eps: float | None = None) -> Tensor:
    """``F.rms_norm`` over the last dimension, in the native CPU kernels
    (:func:`.native_cpu.rms_norm_forward`) where they apply: a float32 / float64 CPU input
    with a weight of its dtype (or none), outside autocast (:func:`.native_cpu.use_for`).
    The same result to rounding (tested); PyTorch's CPU backward of ``F.rms_norm`` is a
    composition of about ten operations, this one pass per row."""
    shape = (x.shape[-1], )
    if (x.dtype in (torch.float32, torch.float64) and native_cpu.use_for(x)
            and x.numel() > 0 and (weight is None or weight.dtype == x.dtype)
            and not torch.is_autocast_enabled(x.device.type)):
        eps = torch.finfo(x.dtype).eps if eps is None else eps
        return _RMSNorm.apply(x, weight, eps)
    return F.rms_norm(x, shape, weight, eps)


class _RMSNorm(torch.autograd.Function):
    """:func:`rms_norm` in the native kernels; keeps ``x`` and the per-row ``rstd``. Not twice
    differentiable."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        x = x.contiguous()
        weight = None if weight is None else weight.contiguous()
        y, rstd = native_cpu.rms_norm_forward(x, weight, eps)
        ctx.save_for_backward(x, rstd, weight)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, rstd, weight = ctx.saved_tensors
        dx, dweight = native_cpu.rms_norm_backward(grad.contiguous(), x, rstd, weight)
        return dx, dweight, None


class RMSNorm(nn.RMSNorm):
    """``torch.nn.RMSNorm`` over the last dimension (same parameters and state dict) that runs
    :func:`rms_norm`: on CPU in the native kernels, elsewhere ``F.rms_norm``."""

    def __init__(self, normalized_shape: int, eps: float | None = None,
                 elementwise_affine: bool = True, **kwargs):
        if not isinstance(normalized_shape, int):
            raise ValueError(f'RMSNorm: normalizes the last dimension only; normalized_shape '
                             f'must be an int, got {normalized_shape!r}')
        super().__init__(normalized_shape, eps, elementwise_affine, **kwargs)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1:] != self.normalized_shape:
            raise ValueError(f'RMSNorm: expected inputs of {self.normalized_shape[0]} channels '
                             f'(last dimension), got {tuple(x.shape)}')
        return rms_norm(x, self.weight, self.eps)


def gated_rms_norm(x: Tensor,
                   z: Tensor | None,
                   weight: Tensor,
                   eps: float = 1e-5,
                   group_size: int | None = None,
                   norm_before_gate: bool = False) -> Tensor:
    """RMSNorm over groups of channels, gated by ``silu(z)``.

    ``norm_before_gate=False`` (Mamba-2's default): ``rmsnorm(x * silu(z)) * weight``;
    ``True``: ``rmsnorm(x) * weight * silu(z)``; ``z=None``: plain ``rmsnorm(x) * weight``.
    The root mean square is taken over each group of ``group_size`` consecutive channels
    (None = all channels). Half-precision inputs are computed in float32. On CUDA, uses
    ``mamba_ssm``'s Triton kernel when available.

    Args:
        x (Tensor): (..., d) input.
        z (Tensor | None): (..., d) gate, or None.
        weight (Tensor): (d,) scale.
        eps (float): added to the mean square. Defaults to 1e-5.
        group_size (int, optional): channels per normalization group; must divide ``d``.
            Defaults to None (one group).
        norm_before_gate (bool): gate after the norm. Defaults to False.

    Returns:
        Tensor: (..., d) in the dtype of ``x``.
    """
    d = x.shape[-1]
    group_size = d if group_size is None else group_size
    if d % group_size != 0 or weight.shape != (d, ):
        raise ValueError(f'gated_rms_norm: channels {d} must be divisible by group_size '
                         f'{group_size} and weight must be ({d},), got {tuple(weight.shape)}')
    if _triton.on_kernel_device(x) and (out := _triton.run_kernel(
            'norm', rmsnorm_fn, 'rmsnorm_fn', x, weight, None, z=z, eps=eps,
            group_size=group_size, norm_before_gate=norm_before_gate)) is not None:
        return out
    return _GatedRMSNorm.apply(x, z, weight, eps, group_size, norm_before_gate)


def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def _normalize(x: Tensor, z: Tensor | None, eps: float, group_size: int,
               norm_before_gate: bool) -> tuple:
    """-> (normalized ``n`` (..., groups, group_size), ``rstd`` (..., groups, 1), gate or None),
    all in the compute dtype; ``n * weight`` (times the gate if ``norm_before_gate``) is the
    output."""
    dtype = _compute_dtype(x)
    xf = x.to(dtype)
    gate = None if z is None else F.silu(z.to(dtype))
    if gate is not None and not norm_before_gate:
        xf = xf * gate
    xg = xf.unflatten(-1, (-1, group_size))
    rstd = torch.rsqrt(xg.pow(2).mean(dim=-1, keepdim=True) + eps)
    return xg * rstd, rstd, gate


class _GatedRMSNorm(torch.autograd.Function):
    """Gated RMSNorm with a hand-written backward that keeps only ``x``, ``z`` and ``weight``
    and recomputes the normalization (autograd of the plain expression keeps about six
    (..., d) intermediates: ~48 MB per call for one DinoVim layer at 1024 px). Not twice
    differentiable."""

    @staticmethod
    def forward(ctx, x, z, weight, eps, group_size, norm_before_gate):
        n, _, gate = _normalize(x, z, eps, group_size, norm_before_gate)
        out = n.flatten(-2) * weight.to(n.dtype)
        if gate is not None and norm_before_gate:
            out = out * gate
        ctx.save_for_backward(x, z, weight)
        ctx.eps, ctx.group_size, ctx.norm_before_gate = eps, group_size, norm_before_gate
        return out.to(x.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        x, z, weight = ctx.saved_tensors
        nbg = ctx.norm_before_gate
        ng, rstd, gate = _normalize(x, z, ctx.eps, ctx.group_size, nbg)
        n = ng.flatten(-2)
        go, w = grad_out.to(n.dtype), weight.to(n.dtype)
        # out = n * w (* gate if nbg); n = h * rstd per group, h = x (* gate if not nbg)
        gated_out = gate is not None and nbg
        dw = (go * n * gate if gated_out else go * n).reshape(-1, n.shape[-1]).sum(0)
        dn = (go * w * gate if gated_out else go * w).unflatten(-1, (-1, ctx.group_size))
        dh = (rstd * (dn - ng * (dn * ng).mean(dim=-1, keepdim=True))).flatten(-2)
        dx, dz = dh, None
        if gate is not None:
            zf = z.to(n.dtype)
            sig = torch.sigmoid(zf)
            dsilu = sig * (1 + zf * (1 - sig))  # d silu(z) / dz
            if nbg:
                dz = go * n * w * dsilu
            else:
                dx, dz = dh * gate, dh * x.to(n.dtype) * dsilu
        return (dx.to(x.dtype), None if dz is None else dz.to(z.dtype), dw.to(weight.dtype),
                None, None, None)
