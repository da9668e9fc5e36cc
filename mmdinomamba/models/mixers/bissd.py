"""Bidirectional Mamba-2 (SSD) token mixer, the "v2" design of Dino-Mamba / Vim.

Paper: "RNN as Linear Transformer: A Closer Investigation into Representational Potentials of
Visual Mamba Models"; Mamba-2: https://arxiv.org/abs/2405.21060; Vim (bidirectional "v2"):
https://arxiv.org/abs/2401.09417.
"""
import math

import torch
import torch.nn as nn
from mmengine.model import BaseModule
from mmpretrain.registry import MODELS
from torch import Tensor

from mmdinomamba.ops import SSD_BACKENDS, InnerDims, bidir_ssd, gated_rms_norm

from .bissd_matrices import BiSSDMatrices

__all__ = ['BiSSD', 'GatedRMSNorm']


class GatedRMSNorm(nn.Module):
    """``rmsnorm(x * silu(z)) * weight`` over groups of ``group_size`` channels (module form of
    :func:`mmdinomamba.ops.gated_rms_norm`; state-dict key ``weight`` as in ``mamba_ssm``)."""

    def __init__(self,
                 dims: int,
                 eps: float = 1e-5,
                 group_size: int | None = None,
                 norm_before_gate: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dims))
        self.eps, self.group_size, self.norm_before_gate = eps, group_size, norm_before_gate

    def forward(self, x: Tensor, z: Tensor | None = None) -> Tensor:
        return gated_rms_norm(x, z, self.weight, self.eps, self.group_size, self.norm_before_gate)


def _dt_bias_init(nheads: int, dt_min: float, dt_max: float, floor: float) -> Tensor:
    """Inverse softplus of ``dt ~ exp(U(log dt_min, log dt_max))`` clamped at ``floor``."""
    dt = torch.exp(torch.rand(nheads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    dt = dt.clamp(min=floor)
    return dt + torch.log(-torch.expm1(-dt))


@MODELS.register_module()
class BiSSD(BiSSDMatrices, BaseModule):
    """Bidirectional Mamba-2 mixer: ``out_proj((norm(y_fwd, z) + norm_b(y_bwd, z)) / 2)``.

    One shared ``in_proj`` (output order z, x, B, C, dt) and one shared ``out_proj``. The forward
    direction uses ``conv1d, dt_bias, A_log, D, norm``; the backward direction has its own
    ``conv1d_b, dt_b_bias, A_log_b, D_b, norm_b`` and scans the reversed sequence. Parameter names
    equal the official Dino-Mamba ``Mamba2`` (``bimamba_type='v2'``) keys, so its checkpoints
    load without renaming.

    Everything between the projections is one call of :func:`~mmdinomamba.ops.bidir_ssd`, which
    runs a kernel where one applies (on CPU the ``mmdinomamba::bidir_ssd`` op, on CUDA our Triton
    kernels around ``mamba_ssm``'s scan) and the reference elsewhere; inside
    :func:`~mmdinomamba.ops.reference_ops` it runs the reference (flip / cat / depthwise conv,
    one SSD scan of both directions, two gated RMSNorms). The exact per-direction maps are
    :meth:`mixing_matrices` (see :class:`BiSSDMatrices`).

    Args:
        embed_dims (int): token channels ``d_model``.
        d_state (int): SSM state size ``n``. Defaults to 64.
        d_conv (int): causal conv kernel. Defaults to 4.
        expand (int): ``d_inner = expand * embed_dims``. Defaults to 2.
        headdim (int): channels per head; ``nheads = d_inner // headdim``. Defaults to 64.
        ngroups (int): groups sharing B and C. Defaults to 1.
        A_init_range (tuple): ``A = -U(*A_init_range)`` at init. Defaults to (1, 16).
        dt_min, dt_max, dt_init_floor (float): dt bias init. Defaults to 1e-3, 0.1, 1e-4.
        chunk_size (int): chunk length of the Triton scan (CUDA); the CPU scans choose
            their own blocks. Defaults to 256.
        bias (bool): biases of in/out projections. Defaults to False.
        conv_bias (bool): conv biases. Defaults to True.
        rmsnorm (bool): gated RMSNorm per direction; False gates with ``silu(z)`` only.
            Defaults to True.
        norm_eps (float): RMSNorm epsilon. Defaults to 1e-5.
        backend (str): SSD backend (see :func:`mmdinomamba.ops.bidir_ssd`); ``'ref'``: the
            reference with the sequential recurrence. Defaults to 'auto'.
        recompute_merge (bool): CUDA: recompute the merged output in the backward pass instead
            of keeping it for ``out_proj`` (saves memory; keeping it made DinoVim-B's training
            step on one H100 1.27x faster). Defaults to False.
        num_heads (int, optional): if given, must equal the derived ``nheads`` (a check for
            generic backbone code). Defaults to None.
        init_cfg (dict, optional): mmengine init config. Defaults to None.
    """

    def __init__(self,
                 embed_dims: int,
                 d_state: int = 64,
                 d_conv: int = 4,
                 expand: int = 2,
                 headdim: int = 64,
                 ngroups: int = 1,
                 A_init_range: tuple = (1, 16),
                 dt_min: float = 1e-3,
                 dt_max: float = 0.1,
                 dt_init_floor: float = 1e-4,
                 chunk_size: int = 256,
                 bias: bool = False,
                 conv_bias: bool = True,
                 rmsnorm: bool = True,
                 norm_eps: float = 1e-5,
                 backend: str = 'auto',
                 recompute_merge: bool = False,
                 num_heads: int | None = None,
                 init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        d_inner = expand * embed_dims
        if d_inner % headdim or (d_inner // headdim) % ngroups:
            raise ValueError(f'expand*embed_dims ({d_inner}) must be divisible by headdim '
                             f'({headdim}) and nheads by ngroups ({ngroups})')
        if num_heads is not None and num_heads != d_inner // headdim:
            raise ValueError(f'num_heads={num_heads} does not match expand*embed_dims/headdim '
                             f'= {d_inner // headdim} for BiSSD')
        if backend not in SSD_BACKENDS:
            raise ValueError(f'backend must be one of {SSD_BACKENDS}, got {backend!r}')
        self.embed_dims, self.d_inner, self.d_state = embed_dims, d_inner, d_state
        self.headdim, self.ngroups, self.num_heads = headdim, ngroups, d_inner // headdim
        self.chunk_size, self.backend, self.recompute_merge = chunk_size, backend, recompute_merge
        self.rmsnorm = rmsnorm
        self.dims = InnerDims(d_inner, ngroups, d_state, headdim, d_conv, norm_eps)
        h, conv_dim = self.num_heads, self.dims.conv_dim
        self.in_proj = nn.Linear(embed_dims, 2 * d_inner + 2 * ngroups * d_state + h, bias=bias)
        self.out_proj = nn.Linear(d_inner, embed_dims, bias=bias)
        for suffix in ('', '_b'):
            setattr(
                self, 'conv1d' + suffix,
                nn.Conv1d(
                    conv_dim, conv_dim, d_conv, groups=conv_dim, padding=d_conv - 1,
                    bias=conv_bias))
            if rmsnorm:
                setattr(self, 'norm' + suffix,
                        GatedRMSNorm(d_inner, norm_eps, group_size=d_inner // ngroups))
        self.dt_bias = nn.Parameter(_dt_bias_init(h, dt_min, dt_max, dt_init_floor))
        self.dt_b_bias = nn.Parameter(_dt_bias_init(h, dt_min, dt_max, dt_init_floor))
        self.A_log = nn.Parameter(torch.empty(h).uniform_(*A_init_range).log())
        self.A_log_b = nn.Parameter(torch.empty(h).uniform_(*A_init_range).log())
        self.D = nn.Parameter(torch.ones(h))
        self.D_b = nn.Parameter(torch.ones(h))
        for name in ('dt_bias', 'dt_b_bias', 'A_log', 'A_log_b', 'D', 'D_b'):
            getattr(self, name)._no_weight_decay = True

    # ---- parameters of both directions ------------------------------------------------------
    def _split(self, proj: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """in_proj output -> z (B, L, d_inner), xBC (B, L, conv_dim), dt (B, L, nheads)."""
        return proj.split([self.d_inner, self.dims.conv_dim, self.num_heads], dim=-1)

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """in_proj -> z, xBC, dt (see :meth:`_split`)."""
        return self._split(self.in_proj(x))

    def _conv_params(self):
        """Filters (2, conv_dim, K) and biases (2, conv_dim) (or None) of the two directions."""
        weight = torch.stack([self.conv1d.weight[:, 0], self.conv1d_b.weight[:, 0]])
        if self.conv1d.bias is None:
            return weight, None
        return weight, torch.stack([self.conv1d.bias, self.conv1d_b.bias])

    def _direction_params(self) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """``dt_bias``, ``A`` and ``D`` (2, nheads) and the norm weights (2, d_inner) or None of
        the two directions."""
        norm = torch.stack([self.norm.weight, self.norm_b.weight]) if self.rmsnorm else None
        return (torch.stack([self.dt_bias, self.dt_b_bias]),
                -torch.exp(torch.stack([self.A_log, self.A_log_b])),
                torch.stack([self.D, self.D_b]), norm)

    def forward(self, x: Tensor, hw: tuple[int, int] | None = None) -> Tensor:
        """Mix tokens ``x`` (B, L, C) -> (B, L, C). ``hw`` is unused (1-D scan over L)."""
        return bidir_ssd(self.in_proj(x), *self._conv_params(), *self._direction_params(),
                         self.dims, self.out_proj, self.backend, self.chunk_size,
                         self.recompute_merge)
