"""Both directions' depthwise causal convs as shifted multiply-adds (channel-major, CPU).

A depthwise conv with a 4-tap kernel is 4 multiply-adds of shifted views; done that way on a
zero-padded channel-major copy of the input (b, C, L + 2 (K - 1)) both directions read the
same buffer at different offsets, with no flipped copy, no concatenation and no layout change,
and the backward pass (a few more multiply-adds and one reduction per tap) avoids the slow
depthwise ``convolution_backward`` of CPU libraries.

With ``xp`` the padded input and ``t`` a token of the original order, the forward direction is
``sum_k w[0, :, k] * xp[t + k]`` (causal) and the backward direction, the conv of the flipped
sequence read back in the original order, ``sum_k w[1, :, k] * xp[t + 2 (K - 1) - k]``
(anti-causal).
"""
import torch
from torch import Tensor

__all__ = ['pad_channel_major', 'bidir_conv_forward', 'bidir_conv_backward']


def pad_channel_major(x: Tensor, kernel: int, dtype: torch.dtype) -> Tensor:
    """(b, L, C) (any strides) -> zero-padded (b, C, L + 2 (kernel - 1)) in ``dtype`` (the
    native conv builds the same layout block by block in cache instead)."""
    b, length, c = x.shape
    pad = kernel - 1
    xp = x.new_empty(b, c, length + 2 * pad, dtype=dtype)
    xp[..., :pad].zero_()
    xp[..., pad + length:].zero_()
    xp[..., pad:pad + length].copy_(x.transpose(1, 2))
    return xp


def _offsets(kernel: int) -> tuple[list[int], list[int]]:
    """Offsets into the padded input of each tap ``k`` of the two directions."""
    return [k for k in range(kernel)], [2 * (kernel - 1) - k for k in range(kernel)]


def bidir_conv_forward(xp: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """Pre-activations (b, 2, C, L) of both directions from the padded input ``xp``.

    Args:
        xp (Tensor): (b, C, L + 2 (K - 1)) from :func:`pad_channel_major`.
        weight (Tensor): (2, C, K) filters of the forward and backward direction.
        bias (Tensor | None): (2, C).
    """
    b, c, padded = xp.shape
    kernel = weight.shape[-1]
    length = padded - 2 * (kernel - 1)
    out = xp.new_empty(b, 2, c, length)
    for d, offsets in enumerate(_offsets(kernel)):
        o = out[:, d]
        for k, off in enumerate(offsets):
            tap = xp[..., off:off + length]
            if k == 0 and bias is None:
                torch.mul(tap, weight[d, :, k, None], out=o)
            elif k == 0:
                torch.addcmul(bias[d, :, None], tap, weight[d, :, k, None], out=o)
            else:
                o.addcmul_(tap, weight[d, :, k, None])
    return out


def bidir_conv_backward(dpre: Tensor, xp: Tensor, weight: Tensor,
                        with_bias: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """Gradients of :func:`bidir_conv_forward` for ``dpre`` (b, 2, C, L).

    Returns:
        tuple: ``dx`` (b, C, L) (a view into a padded buffer), ``dweight`` (2, C, K) and
        ``dbias`` (2, C) or None.
    """
    kernel = weight.shape[-1]
    length = dpre.shape[-1]
    dxp = torch.zeros_like(xp)
    dweight = weight.new_empty(weight.shape, dtype=dpre.dtype)
    for d, offsets in enumerate(_offsets(kernel)):
        g = dpre[:, d]
        for k, off in enumerate(offsets):
            dxp[..., off:off + length].addcmul_(g, weight[d, :, k, None])
            dweight[d, :, k] = (g * xp[..., off:off + length]).sum((0, 2))
    dbias = dpre.sum((0, 3)) if with_bias else None
    return dxp[..., kernel - 1:kernel - 1 + length], dweight, dbias
