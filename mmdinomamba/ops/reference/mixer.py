"""The whole bidirectional Mamba-2 mixer between its projections, as a composition of the
reference ops: the specification that the fused kernels are tested against."""
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .conv import bidir_causal_conv1d_ref
from .norm import bidir_gated_merge_ref
from .ssd_chunked import ssd_scan_chunked

__all__ = ['InnerDims', 'split_conv_output', 'conv_scan_inputs', 'bidir_conv_scan_ref',
           'direction_inputs', 'bidir_mixer_ref']


@dataclass(frozen=True)
class InnerDims:
    """Sizes of a bidirectional mixer: ``d_inner``, ``ngroups``, ``d_state``, ``headdim``,
    the conv ``kernel`` and the RMSNorm ``eps``."""
    d_inner: int
    ngroups: int
    d_state: int
    headdim: int
    kernel: int
    eps: float = 1e-5

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.ngroups * self.d_state

    @property
    def nheads(self) -> int:
        return self.d_inner // self.headdim

    @property
    def splits(self) -> tuple[int, int, int]:
        """Conv channel segments (x, B, C) of one direction."""
        gn = self.ngroups * self.d_state
        return self.d_inner, gn, gn

    @property
    def width(self) -> int:
        """Channels of the ``in_proj`` output ``[z, x, B, C, dt]``."""
        return self.d_inner + self.conv_dim + self.nheads


def split_conv_output(conv: Tensor, splits: Sequence[int], headdim: int,
                      d_state: int) -> tuple[Tensor, Tensor, Tensor]:
    """Views ``u`` (B, L, 2h, headdim), ``B`` and ``C`` (B, L, 2g, d_state) of the output of
    a bidirectional conv with ``splits = (d, g * d_state, g * d_state)`` (channels ``[x_f, x_b,
    B_f, B_b, C_f, C_b]``)."""
    d, gn = splits[0], splits[1]
    u = conv[..., :2 * d].unflatten(-1, (-1, headdim))
    Bm = conv[..., 2 * d:2 * d + 2 * gn].unflatten(-1, (-1, d_state))
    Cm = conv[..., 2 * d + 2 * gn:].unflatten(-1, (-1, d_state))
    return u, Bm, Cm


def conv_scan_inputs(xBC: Tensor, conv_weight: Tensor, conv_bias: Tensor | None, dt: Tensor,
                     dt_bias: Tensor, splits: Sequence[int], headdim: int, d_state: int,
                     conv_fn: Callable = bidir_causal_conv1d_ref) -> tuple[Tensor, ...]:
    """Scan inputs ``u``, ``dt`` (after bias and softplus, in float32 or better), ``B``, ``C``
    of both directions: ``conv_fn`` + SiLU on ``xBC``, split by :func:`split_conv_output`."""
    conv = conv_fn(xBC, conv_weight, conv_bias, splits, 'silu')
    u, Bm, Cm = split_conv_output(conv, splits, headdim, d_state)
    ct = torch.promote_types(dt.dtype, torch.float32)
    return u, F.softplus(dt.to(ct) + dt_bias.to(ct)), Bm, Cm


def bidir_conv_scan_ref(xBC: Tensor, conv_weight: Tensor, conv_bias: Tensor | None, dt: Tensor,
                        dt_bias: Tensor, A: Tensor, D: Tensor, splits: Sequence[int],
                        headdim: int, d_state: int, scan: Callable = ssd_scan_chunked) -> Tensor:
    """Both directions' conv + SiLU and one SSD ``scan`` of both (heads ``[0, h)`` the forward
    direction, ``[h, 2h)`` the backward one in flipped time order): (B, L, 2h, headdim)."""
    u, dt, Bm, Cm = conv_scan_inputs(xBC, conv_weight, conv_bias, dt, dt_bias, splits, headdim,
                                     d_state)
    return scan(u, dt, A, Bm, Cm, D)


def direction_inputs(proj: Tensor, dt_bias: Tensor, A: Tensor, D: Tensor,
                     dims: InnerDims) -> tuple[Tensor, ...]:
    """``z``, ``xBC`` and the raw ``dt`` (B, L, 2h) of both directions (the backward heads on
    the flipped sequence) from the projection, with ``dt_bias``, ``A`` and ``D`` (2, h)
    flattened to (2h,) (``A`` in float32 or better)."""
    z, xBC, dt = proj.split([dims.d_inner, dims.conv_dim, dims.nheads], dim=-1)
    ct = torch.promote_types(dt.dtype, torch.float32)
    return (z, xBC, torch.cat([dt, dt.flip(1)], dim=-1), dt_bias.flatten(),
            A.flatten().to(ct), D.flatten())


def bidir_mixer_ref(proj: Tensor, conv_weight: Tensor, conv_bias: Tensor | None,
                    dt_bias: Tensor, A: Tensor, D: Tensor, norm_weight: Tensor | None,
                    dims: InnerDims, scan: Callable = ssd_scan_chunked) -> Tensor:
    """Both directions of a bidirectional Mamba-2 mixer between its projections.

    With ``proj = [z, x, B, C, dt]`` (channel sizes ``d, d, g n, g n, h``), direction ``k``
    (0 forward, 1 backward) computes ``y_k = SSD_k(conv_k(x, B, C), softplus(dt + dt_bias[k]),
    A[k], D[k])`` (the backward direction on the reversed sequence) and the result is
    ``(rmsnorm(y_0 * silu(z)) * w[0] + rmsnorm(y_1 * silu(z)) * w[1]) / 2`` with the root mean
    square over groups of ``d / g`` channels (``norm_weight=None``: ``(y_0 + y_1) / 2 *
    silu(z)``), in the original token order.

    Args:
        proj (Tensor): (b, L, 2 d + 2 g n + h) ``in_proj`` output.
        conv_weight (Tensor): (2, d + 2 g n, K) filters of the two directions.
        conv_bias (Tensor | None): (2, d + 2 g n).
        dt_bias (Tensor): (2, h).
        A (Tensor): (2, h) negative decay rates.
        D (Tensor): (2, h) skip weights.
        norm_weight (Tensor | None): (2, d) RMSNorm scales, or None (no norm).
        dims (InnerDims): the mixer's sizes.
        scan (Callable): the SSD scan (``ssd_scan_ref`` for the sequential recurrence).
            Defaults to the chunked scan.

    Returns:
        Tensor: (b, L, d) in the dtype of ``proj``.
    """
    z, xBC, dt, dt_bias, A, D = direction_inputs(proj, dt_bias, A, D, dims)
    y = bidir_conv_scan_ref(xBC, conv_weight, conv_bias, dt, dt_bias, A, D, dims.splits,
                            dims.headdim, dims.d_state, scan)
    return bidir_gated_merge_ref(y.flatten(2), z, norm_weight, dims.eps,
                                 dims.d_inner // dims.ngroups)
