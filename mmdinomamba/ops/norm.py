"""Gated RMSNorm as used by Mamba-2 (``mamba_ssm``'s ``RMSNormGated``), in plain PyTorch."""
import torch
import torch.nn.functional as F
from torch import Tensor

from ._triton import rmsnorm_fn

__all__ = ['gated_rms_norm']


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
    if x.is_cuda and (fn := rmsnorm_fn()) is not None:
        return fn(
            x, weight, None, z=z, eps=eps, group_size=group_size, norm_before_gate=norm_before_gate)
    dtype = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    xf = x.to(dtype)
    gate = None if z is None else F.silu(z.to(dtype))
    if gate is not None and not norm_before_gate:
        xf = xf * gate
    xg = xf.unflatten(-1, (d // group_size, group_size))
    out = (xg * torch.rsqrt(xg.pow(2).mean(dim=-1, keepdim=True) + eps)).flatten(-2)
    out = out * weight.to(dtype)
    if gate is not None and norm_before_gate:
        out = out * gate
    return out.to(x.dtype)
