"""Depthwise causal 1-D convolutions (Mamba's short conv): ``causal_conv1d`` of one direction
and ``bidir_causal_conv1d`` of both directions of a bidirectional mixer. On CUDA they run the
``causal_conv1d`` package and our fused Triton kernel where available; elsewhere, and inside
:func:`~mmdinomamba.ops.reference_ops`, their references (:mod:`.reference.conv`)."""
from typing import Sequence

from torch import Tensor

from .cuda import _triton
from .reference.conv import (bidir_causal_conv1d_ref, causal_conv1d_ref, check_activation,
                             check_bidir_conv)

__all__ = ['causal_conv1d', 'bidir_causal_conv1d']


def causal_conv1d(x: Tensor,
                  weight: Tensor,
                  bias: Tensor | None = None,
                  activation: str | None = 'silu') -> Tensor:
    """``y[:, t, d] = act(bias[d] + sum_k weight[d, k] * x[:, t - (K - 1) + k, d])``.

    Zero padding on the left (causal): output ``t`` sees inputs ``t - K + 1 .. t``. This equals
    ``nn.Conv1d(D, D, K, groups=D, padding=K - 1)`` on ``x.transpose(1, 2)``, cut to ``L``
    outputs.

    Args:
        x (Tensor): (batch, length, channels).
        weight (Tensor): (channels, kernel) depthwise filters.
        bias (Tensor, optional): (channels,). Defaults to None.
        activation (str | None): ``'silu'`` (or ``'swish'``) or None. Defaults to 'silu'.

    Returns:
        Tensor: (batch, length, channels).
    """
    check_activation(activation)
    if _triton.on_kernel_device(x) and x.dim() == 3 and (y := _triton.run_kernel(
            'conv', _triton.causal_conv1d_fn, 'causal_conv1d_fn', x.transpose(1, 2), weight,
            bias, activation=activation)) is not None:
        return y.transpose(1, 2)
    return causal_conv1d_ref(x, weight, bias, activation)


def bidir_causal_conv1d(x: Tensor, weight: Tensor, bias: Tensor | None, splits: Sequence[int],
                        activation: str | None = 'silu') -> Tensor:
    """Forward conv on ``x`` and backward conv on the time-flipped ``x``, channel-interleaved
    (:func:`~mmdinomamba.ops.reference.bidir_causal_conv1d_ref` says exactly what).

    On CUDA this is one Triton kernel (forward and backward) that reads the flipped sequence by
    index arithmetic, so no flipped copy, concatenation or layout transpose is materialized.

    Args:
        x (Tensor): (B, L, C), last dimension contiguous (a split of a projection is fine).
        weight (Tensor): (2, C, K) filters of the forward and backward direction.
        bias (Tensor, optional): (2, C).
        splits (Sequence[int]): 1-3 channel segment sizes adding up to C.
        activation (str | None): 'silu' or None. Defaults to 'silu'.

    Returns:
        Tensor: (B, L, 2C).
    """
    check_bidir_conv(x, weight, bias, splits)
    check_activation(activation)
    if _triton.on_kernel_device(x) and (y := _triton.run_kernel(
            'bidir_conv', _triton.bidir_conv_fn, 'fused bidirectional conv', x, weight, bias,
            tuple(splits), activation is not None)) is not None:
        return y
    return bidir_causal_conv1d_ref(x, weight, bias, splits, activation)
