"""Both directions' depthwise causal convs of a bidirectional Mamba mixer in one call."""
from typing import Sequence

import torch
from torch import Tensor

from . import _triton
from ._triton import bidir_conv_fn
from .conv import causal_conv1d, check_activation

__all__ = ['bidir_causal_conv1d']


def _check(x: Tensor, weight: Tensor, bias: Tensor | None, splits: Sequence[int]) -> None:
    c = x.shape[-1] if x.dim() == 3 else -1
    if (x.dim() != 3 or weight.dim() != 3 or weight.shape[:2] != (2, c)
            or (bias is not None and tuple(bias.shape) != (2, c))):
        raise ValueError(f'bidir_causal_conv1d: need x (B, L, C), weight (2, C, K) and bias '
                         f'(2, C) or None; got {tuple(x.shape)}, {tuple(weight.shape)}, '
                         f'{None if bias is None else tuple(bias.shape)}')
    if not 1 <= len(splits) <= 3 or sum(splits) != c or min(splits) < 1:
        raise ValueError(f'bidir_causal_conv1d: splits {list(splits)} must be 1-3 positive '
                         f'sizes adding up to C={c}')


def bidir_causal_conv1d_portable(x: Tensor, weight: Tensor, bias: Tensor | None,
                                 splits: Sequence[int], activation: str | None = 'silu') -> Tensor:
    """The specification of :func:`bidir_causal_conv1d` in plain PyTorch (flip, cat, conv)."""
    splits = list(splits)

    def interleave(fwd: Tensor, bwd: Tensor, dim: int) -> Tensor:
        """[fwd_0, bwd_0, fwd_1, bwd_1, ...] of the ``splits`` segments along ``dim``."""
        pairs = zip(fwd.split(splits, dim=dim), bwd.split(splits, dim=dim))
        return torch.cat([t for pair in pairs for t in pair], dim=dim)

    b = None if bias is None else interleave(bias[0], bias[1], 0)
    return causal_conv1d(interleave(x, x.flip(1), -1), interleave(weight[0], weight[1], 0), b,
                         activation=activation)


def bidir_causal_conv1d(x: Tensor, weight: Tensor, bias: Tensor | None, splits: Sequence[int],
                        activation: str | None = 'silu') -> Tensor:
    """Forward conv on ``x`` and backward conv on the time-flipped ``x``, channel-interleaved.

    With segments ``x = [x_0, x_1, ...]`` of ``splits`` channels (e.g. Mamba's x, B, C) and
    ``conv_d`` the depthwise causal conv (+ SiLU) of direction ``d`` (``weight[d]``,
    ``bias[d]``), the output is ``[conv_0(x_0), conv_1(flip(x_0)), conv_0(x_1),
    conv_1(flip(x_1)), ...]`` along channels, every backward part in FLIPPED time order: exactly
    the inputs of one SSD scan of both directions (backward heads on the flipped sequence).

    On CUDA this is one Triton kernel (forward and backward) that reads the flipped sequence by
    index arithmetic, so no flipped copy, concatenation or layout transpose is materialized;
    elsewhere (or inside :func:`~mmdinomamba.ops.portable_ops`, or if the kernel fails) it is
    :func:`bidir_causal_conv1d_portable`, the specification.

    Args:
        x (Tensor): (B, L, C), last dimension contiguous (a split of a projection is fine).
        weight (Tensor): (2, C, K) filters of the forward and backward direction.
        bias (Tensor, optional): (2, C).
        splits (Sequence[int]): 1-3 channel segment sizes adding up to C.
        activation (str | None): 'silu' or None. Defaults to 'silu'.

    Returns:
        Tensor: (B, L, 2C).
    """
    _check(x, weight, bias, splits)
    check_activation(activation)
    if _triton.on_kernel_device(x) and (y := _triton.run_kernel(
            'bidir_conv', bidir_conv_fn, 'fused bidirectional conv', x, weight, bias,
            tuple(splits), activation is not None)) is not None:
        return y
    return bidir_causal_conv1d_portable(x, weight, bias, splits, activation)
