"""Gated RMSNorm as used by Mamba-2 (``mamba_ssm``'s ``RMSNormGated``) and the output side of a
bidirectional Mamba mixer (un-flip the backward direction, gate and normalize each direction,
average), in plain PyTorch."""
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ['gated_rms_norm_ref', 'bidir_gated_merge_ref', 'check_merge']


def gated_rms_norm_ref(x: Tensor,
                   z: Tensor | None,
                   weight: Tensor,
                   eps: float = 1e-5,
                   group_size: int | None = None,
                   norm_before_gate: bool = False) -> Tensor:
    """RMSNorm over groups of channels, gated by ``silu(z)``.

    ``norm_before_gate=False`` (Mamba-2's default): ``rmsnorm(x * silu(z)) * weight``;
    ``True``: ``rmsnorm(x) * weight * silu(z)``; ``z=None``: plain ``rmsnorm(x) * weight``.
    The root mean square is taken over each group of ``group_size`` consecutive channels
    (None = all channels). Half-precision inputs are computed in float32.

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


def check_merge(y: Tensor, z: Tensor, weight: Tensor | None, group_size: int | None) -> int:
    d = z.shape[-1] if z.dim() == 3 else -1
    if (y.dim() != 3 or z.dim() != 3 or y.shape != (*z.shape[:2], 2 * d)
            or (weight is not None and tuple(weight.shape) != (2, d))):
        raise ValueError(f'bidir_gated_merge: need y (B, L, 2d), z (B, L, d) and weight (2, d) '
                         f'or None; got {tuple(y.shape)}, {tuple(z.shape)}, '
                         f'{None if weight is None else tuple(weight.shape)}')
    group_size = d if group_size is None else group_size
    if group_size < 1 or d % group_size:
        raise ValueError(f'bidir_gated_merge: group_size {group_size} must divide d={d}')
    return group_size


def bidir_gated_merge_ref(y: Tensor, z: Tensor, weight: Tensor | None, eps: float = 1e-5,
                               group_size: int | None = None) -> Tensor:
    """Merge both scan directions of a bidirectional Mamba-2 mixer (slice, flip, two gated
    RMSNorms, average).

    ``y`` (B, L, 2d) holds the forward direction's outputs in channels ``[0, d)`` (token order)
    and the backward direction's in ``[d, 2d)`` (FLIPPED time order, as one scan of both
    directions returns them). With ``y_f = y[..., :d]`` and ``y_b = flip(y[..., d:])`` the
    result (B, L, d) is ``(rmsnorm(y_f * silu(z)) * weight[0] + rmsnorm(y_b * silu(z)) *
    weight[1]) / 2``, the root mean square over groups of ``group_size`` channels, or, with
    ``weight=None``, ``(y_f + y_b) / 2 * silu(z)``.
    """
    group_size = check_merge(y, z, weight, group_size)
    d = z.shape[-1]
    y_f, y_b = y[..., :d], y[..., d:].flip(1)  # backward direction back to token order
    if weight is None:
        return (y_f + y_b) / 2 * F.silu(z)
    return (gated_rms_norm_ref(y_f, z, weight[0], eps, group_size) +
            gated_rms_norm_ref(y_b, z, weight[1], eps, group_size)) / 2
