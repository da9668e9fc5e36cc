"""Both directions' causal conv + SSD scan of a bidirectional Mamba-2 mixer in one call, with
the conv recomputed in the backward pass instead of kept."""
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _triton
from .bidir_conv import bidir_causal_conv1d
from .ssd import ssd_scan

__all__ = ['bidir_conv_scan', 'split_conv_output', 'conv_scan_inputs']


def split_conv_output(conv: Tensor, splits: Sequence[int], headdim: int,
                      d_state: int) -> tuple[Tensor, Tensor, Tensor]:
    """Views ``u`` (B, L, 2h, headdim), ``B`` and ``C`` (B, L, 2g, d_state) of the output of
    :func:`~mmdinomamba.ops.bidir_causal_conv1d` with ``splits = (d, g * d_state, g * d_state)``
    (channels ``[x_f, x_b, B_f, B_b, C_f, C_b]``)."""
    d, gn = splits[0], splits[1]
    u = conv[..., :2 * d].unflatten(-1, (-1, headdim))
    Bm = conv[..., 2 * d:2 * d + 2 * gn].unflatten(-1, (-1, d_state))
    Cm = conv[..., 2 * d + 2 * gn:].unflatten(-1, (-1, d_state))
    return u, Bm, Cm


def conv_scan_inputs(xBC: Tensor, conv_weight: Tensor, conv_bias: Tensor | None, dt: Tensor,
                     dt_bias: Tensor, splits: Sequence[int], headdim: int, d_state: int,
                     conv_fn: Callable = bidir_causal_conv1d) -> tuple[Tensor, ...]:
    """Scan inputs ``u``, ``dt`` (after bias and softplus, in float32 or better), ``B``, ``C``
    of both directions: ``conv_fn`` (:func:`bidir_causal_conv1d` or its portable spec) + SiLU
    on ``xBC``, split by :func:`split_conv_output`."""
    conv = conv_fn(xBC, conv_weight, conv_bias, splits, 'silu')
    u, Bm, Cm = split_conv_output(conv, splits, headdim, d_state)
    ct = torch.promote_types(dt.dtype, torch.float32)
    return u, F.softplus(dt.to(ct) + dt_bias.to(ct)), Bm, Cm


def bidir_conv_scan_composed(xBC: Tensor, conv_weight: Tensor, conv_bias: Tensor | None,
                             dt: Tensor, dt_bias: Tensor, A: Tensor, D: Tensor,
                             splits: Sequence[int], headdim: int, d_state: int,
                             chunk_size: int = 256, backend: str = 'auto') -> Tensor:
    """:func:`bidir_conv_scan` as the composition of :func:`bidir_causal_conv1d` and
    :func:`ssd_scan` (each dispatching on its own; the specification on CPU)."""
    u, dt, Bm, Cm = conv_scan_inputs(xBC, conv_weight, conv_bias, dt, dt_bias, splits, headdim,
                                     d_state)
    return ssd_scan(u, dt, A, Bm, Cm, D, chunk_size=chunk_size, backend=backend)


def bidir_conv_scan(xBC: Tensor,
                    conv_weight: Tensor,
                    conv_bias: Tensor | None,
                    dt: Tensor,
                    dt_bias: Tensor,
                    A: Tensor,
                    D: Tensor,
                    splits: Sequence[int],
                    headdim: int,
                    d_state: int,
                    chunk_size: int = 256,
                    backend: str = 'auto') -> Tensor:
    """SSD scan of both directions on their causal conv + SiLU outputs.

    Computes ``conv = bidir_causal_conv1d(xBC, conv_weight, conv_bias, splits, 'silu')``, splits
    it into ``u, B, C`` (:func:`split_conv_output`) and returns
    ``ssd_scan(u, softplus(dt + dt_bias), A, B, C, D)``: heads ``[0, h)`` the forward direction,
    ``[h, 2h)`` the backward direction in flipped time order.

    On CUDA with ``mamba_ssm`` this is one autograd function (our fused conv kernel and
    ``mamba_ssm``'s SSD forward / backward, softplus inside the scan kernel) that keeps only its
    inputs and the scan output and recomputes the conv in the backward pass: per layer it does not
    keep the (B, L, 2 * sum(splits)) conv output (a quarter of a DinoVim layer's activations).
    Elsewhere (or inside :func:`~mmdinomamba.ops.portable_ops`, or if it fails) it is the
    composition :func:`bidir_conv_scan_composed`.

    Args:
        xBC (Tensor): (B, L, C) conv input, channels ``[x, B, C]``, last dim contiguous.
        conv_weight (Tensor): (2, C, K) filters of the forward and backward direction.
        conv_bias (Tensor | None): (2, C).
        dt (Tensor): (B, L, 2h) step sizes before bias and softplus (backward heads flipped).
        dt_bias (Tensor): (2h,).
        A (Tensor): (2h,) negative decay rates.
        D (Tensor): (2h,) skip weights.
        splits (Sequence[int]): ``(d_inner, ngroups * d_state, ngroups * d_state)``.
        headdim (int): channels per head (``2h = 2 * d_inner / headdim``).
        d_state (int): state size.
        chunk_size (int): chunk length of the Triton scan. Defaults to 256.
        backend (str): SSD backend of the composition (see :func:`ssd_scan`); the fused path is
            taken only for ``'auto'`` and ``'triton'``. Defaults to 'auto'.

    Returns:
        Tensor: (B, L, 2h, headdim) in the dtype of ``xBC``.
    """
    args = (xBC, conv_weight, conv_bias, dt, dt_bias, A, D, tuple(splits), headdim, d_state,
            chunk_size)
    if (backend in ('auto', 'triton') and _triton.on_kernel_device(xBC)
            and (y := _triton.run_kernel('conv_scan', _triton.conv_scan_fn,
                                         'fused conv + scan', *args)) is not None):
        return y
    return bidir_conv_scan_composed(*args, backend=backend)
