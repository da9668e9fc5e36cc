"""Depthwise causal 1-D convolutions over tokens (Mamba's short conv), in plain PyTorch: one
direction, and both directions of a bidirectional mixer."""
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ['check_activation', 'causal_conv1d_ref', 'bidir_causal_conv1d_ref', 'check_bidir_conv']


def check_activation(activation: str | None) -> None:
    """The activations the causal convs support: 'silu' (alias 'swish') or None."""
    if activation not in (None, 'silu', 'swish'):
        raise ValueError(f"activation must be 'silu', 'swish' or None, got {activation!r}")


def causal_conv1d_ref(x: Tensor, weight: Tensor, bias: Tensor | None = None,
                      activation: str | None = 'silu') -> Tensor:
    """``y[:, t, d] = act(bias[d] + sum_k weight[d, k] * x[:, t - (K - 1) + k, d])`` of ``x``
    (B, L, D) and ``weight`` (D, K) (zero padding on the left)."""
    check_activation(activation)
    if x.dim() != 3 or weight.dim() != 2 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f'causal_conv1d: x must be (B, L, D) and weight (D, K), got '
                         f'{tuple(x.shape)} and {tuple(weight.shape)}')
    length, (channels, k) = x.shape[1], weight.shape
    y = F.conv1d(x.transpose(1, 2), weight.unsqueeze(1), bias, padding=k - 1, groups=channels)
    y = y[..., :length].transpose(1, 2)
    return y if activation is None else F.silu(y)


def check_bidir_conv(x: Tensor, weight: Tensor, bias: Tensor | None,
                     splits: Sequence[int]) -> None:
    """A ``ValueError`` naming what breaks :func:`bidir_causal_conv1d_ref`'s shapes."""
    c = x.shape[-1] if x.dim() == 3 else -1
    if (x.dim() != 3 or weight.dim() != 3 or weight.shape[:2] != (2, c)
            or (bias is not None and tuple(bias.shape) != (2, c))):
        raise ValueError(f'bidir_causal_conv1d: need x (B, L, C), weight (2, C, K) and bias '
                         f'(2, C) or None; got {tuple(x.shape)}, {tuple(weight.shape)}, '
                         f'{None if bias is None else tuple(bias.shape)}')
    if not 1 <= len(splits) <= 3 or sum(splits) != c or min(splits) < 1:
        raise ValueError(f'bidir_causal_conv1d: splits {list(splits)} must be 1-3 positive '
                         f'sizes adding up to C={c}')


def bidir_causal_conv1d_ref(x: Tensor, weight: Tensor, bias: Tensor | None,
                            splits: Sequence[int], activation: str | None = 'silu') -> Tensor:
    """Forward conv on ``x`` and backward conv on the time-flipped ``x``, channel-interleaved
    (flip, cat, conv): with segments ``x = [x_0, x_1, ...]`` of ``splits`` channels and
    ``conv_d`` the causal conv (+ SiLU) of direction ``d``, ``[conv_0(x_0), conv_1(flip(x_0)),
    conv_0(x_1), conv_1(flip(x_1)), ...]``, every backward part in FLIPPED time order: the
    inputs of one SSD scan of both directions. ``x`` (B, L, C), ``weight`` (2, C, K), ``bias``
    (2, C) or None; returns (B, L, 2C)."""
    check_bidir_conv(x, weight, bias, splits)
    splits = list(splits)

    def interleave(fwd: Tensor, bwd: Tensor, dim: int) -> Tensor:
        pairs = zip(fwd.split(splits, dim=dim), bwd.split(splits, dim=dim))
        return torch.cat([t for pair in pairs for t in pair], dim=dim)

    b = None if bias is None else interleave(bias[0], bias[1], 0)
    return causal_conv1d_ref(interleave(x, x.flip(1), -1), interleave(weight[0], weight[1], 0),
                             b, activation=activation)
