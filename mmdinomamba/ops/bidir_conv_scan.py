"""Both directions' causal conv + SSD scan of a bidirectional Mamba-2 mixer in one call; on CUDA
one op that recomputes the conv in the backward pass instead of keeping it."""
from typing import Sequence

from torch import Tensor

from .conv import bidir_causal_conv1d
from .cuda import _triton
from .reference.mixer import conv_scan_inputs
from .ssd import ssd_scan

__all__ = ['bidir_conv_scan', 'bidir_conv_scan_composed']


def bidir_conv_scan_composed(xBC: Tensor, conv_weight: Tensor, conv_bias: Tensor | None,
                             dt: Tensor, dt_bias: Tensor, A: Tensor, D: Tensor,
                             splits: Sequence[int], headdim: int, d_state: int,
                             chunk_size: int = 256, backend: str = 'auto') -> Tensor:
    """:func:`bidir_conv_scan` as the composition of :func:`~mmdinomamba.ops.bidir_causal_conv1d`
    and :func:`~mmdinomamba.ops.ssd_scan` (each dispatching on its own)."""
    u, dt, Bm, Cm = conv_scan_inputs(xBC, conv_weight, conv_bias, dt, dt_bias, splits, headdim,
                                     d_state, bidir_causal_conv1d)
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
    """SSD scan of both directions on their causal conv + SiLU outputs
    (:func:`~mmdinomamba.ops.reference.bidir_conv_scan_ref` says exactly what).

    On CUDA with ``mamba_ssm`` this is the op ``mmdinomamba::bidir_conv_scan`` (our fused conv
    kernel and ``mamba_ssm``'s SSD forward / backward, softplus inside the scan kernel) that keeps
    only its inputs and the scan output and recomputes the conv in the backward pass; elsewhere
    the composition :func:`bidir_conv_scan_composed`.

    Args:
        xBC (Tensor): (B, L, C) conv input, channels ``[x, B, C]``, last dim contiguous.
        conv_weight (Tensor): (2, C, K) filters of the forward and backward direction.
        conv_bias (Tensor | None): (2, C).
        dt (Tensor): (B, L, 2h) step sizes before bias and softplus (backward heads flipped).
        dt_bias (Tensor): (2h,).
        A (Tensor): (2h,) negative decay rates.
        D (Tensor): (2h,) skip weights.
        splits (Sequence[int]): ``(d_inner, ngroups * d_state, ngroups * d_state)``.
        headdim (int): channels per head.
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
            and (op := _triton.kernel('conv_scan')) is not None):
        return op(*args)
    return bidir_conv_scan_composed(*args, backend=backend)
