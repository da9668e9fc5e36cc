"""Depthwise causal 1-D convolution over tokens (Mamba's short conv), in plain PyTorch."""
import torch.nn.functional as F
from torch import Tensor

from . import _triton
from ._triton import causal_conv1d_fn

__all__ = ['causal_conv1d', 'check_activation']


def check_activation(activation: str | None) -> None:
    """The activations the causal convs support: 'silu' (alias 'swish') or None."""
    if activation not in (None, 'silu', 'swish'):
        raise ValueError(f"activation must be 'silu', 'swish' or None, got {activation!r}")


def causal_conv1d(x: Tensor,
                  weight: Tensor,
                  bias: Tensor | None = None,
                  activation: str | None = 'silu') -> Tensor:
    """``y[:, t, d] = act(bias[d] + sum_k weight[d, k] * x[:, t - (K - 1) + k, d])``.

    Zero padding on the left (causal): output ``t`` sees inputs ``t - K + 1 .. t``. This equals
    ``nn.Conv1d(D, D, K, groups=D, padding=K - 1)`` on ``x.transpose(1, 2)``, cut to ``L``
    outputs. On CUDA, uses the ``causal_conv1d`` package when it is installed.

    Args:
        x (Tensor): (batch, length, channels).
        weight (Tensor): (channels, kernel) depthwise filters.
        bias (Tensor, optional): (channels,). Defaults to None.
        activation (str | None): ``'silu'`` (or ``'swish'``) or None. Defaults to 'silu'.

    Returns:
        Tensor: (batch, length, channels).
    """
    check_activation(activation)
    if x.dim() != 3 or weight.dim() != 2 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f'causal_conv1d: x must be (B, L, D) and weight (D, K), got '
                         f'{tuple(x.shape)} and {tuple(weight.shape)}')
    if _triton.on_kernel_device(x) and (y := _triton.run_kernel(
            'conv', causal_conv1d_fn, 'causal_conv1d_fn', x.transpose(1, 2), weight, bias,
            activation=activation)) is not None:
        return y.transpose(1, 2)
    length, (channels, k) = x.shape[1], weight.shape
    y = F.conv1d(x.transpose(1, 2), weight.unsqueeze(1), bias, padding=k - 1, groups=channels)
    y = y[..., :length].transpose(1, 2)
    return y if activation is None else F.silu(y)
