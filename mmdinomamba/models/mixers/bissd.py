"""Bidirectional Mamba-2 (SSD) token mixer, the "v2" design of Dino-Mamba / Vim.

Paper: "RNN as Linear Transformer: A Closer Investigation into Representational Potentials of
Visual Mamba Models"; Mamba-2: https://arxiv.org/abs/2405.21060; Vim (bidirectional "v2"):
https://arxiv.org/abs/2401.09417.
"""
import functools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule
from mmpretrain.registry import MODELS
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from mmdinomamba.ops import (SSD_BACKENDS, InnerDims, _triton, bidir_causal_conv1d,
                             bidir_conv_scan, bidir_gated_merge, bidir_ssd_inner, current_variant,
                             gated_rms_norm, quadratic_form_by_length, ssd_scan,
                             use_quadratic_form)
from mmdinomamba.ops.bidir_conv import bidir_causal_conv1d_portable
from mmdinomamba.ops.bidir_conv_scan import conv_scan_inputs
from mmdinomamba.ops.bidir_merge import bidir_gated_merge_portable

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


_HOOKS = ('_forward_hooks', '_forward_pre_hooks', '_backward_hooks', '_backward_pre_hooks')


def _plain_linear(module: nn.Module) -> bool:
    """Whether calling ``module`` only runs ``F.linear(x, weight, bias)``: an ``nn.Linear``
    itself (not a subclass, e.g. a parametrized one) with no hooks of its own and no global
    module hooks, so that running that function in its place skips nothing."""
    glob = torch.nn.modules.module
    return type(module) is nn.Linear and not any(
        getattr(module, h, None) or getattr(glob, '_global' + h, None) for h in _HOOKS)


@MODELS.register_module()
class BiSSD(BiSSDMatrices, BaseModule):
    """Bidirectional Mamba-2 mixer: ``out_proj((norm(y_fwd, z) + norm_b(y_bwd, z)) / 2)``.

    One shared ``in_proj`` (output order z, x, B, C, dt) and one shared ``out_proj``. The forward
    direction uses ``conv1d, dt_bias, A_log, D, norm``; the backward direction has its own
    ``conv1d_b, dt_b_bias, A_log_b, D_b, norm_b`` and scans the reversed sequence. Parameter names
    equal the official Dino-Mamba ``Mamba2`` (``bimamba_type='v2'``) keys, so its checkpoints
    load without renaming.

    ``fast_path`` (like ``mamba_ssm``'s ``use_mem_eff_path``) picks how it is computed; both
    give the same result up to rounding. On CUDA the fast path runs our fused Triton kernels
    (both directions' conv + scan in one function that recomputes the conv in backward, un-flip +
    both norms + average in one kernel) around ``mamba_ssm``'s scan; on CPU, for sequences up to
    :func:`~mmdinomamba.ops.quadratic_max_len` tokens, everything between the projections is one
    autograd function (:func:`~mmdinomamba.ops.bidir_ssd_inner`). ``fast_path=False`` is the
    specification: flip / cat / depthwise conv, one SSD scan of both directions
    (:func:`~mmdinomamba.ops.ssd_scan`), two gated RMSNorms. The pieces of the fast path are
    switched for benchmarks by :func:`~mmdinomamba.ops.fast_path_variant`. The exact
    per-direction maps are :meth:`mixing_matrices` (see :class:`BiSSDMatrices`).

    Args:
        embed_dims (int): token channels ``d_model``.
        d_state (int): SSM state size ``n``. Defaults to 64.
        d_conv (int): causal conv kernel. Defaults to 4.
        expand (int): ``d_inner = expand * embed_dims``. Defaults to 2.
        headdim (int): channels per head; ``nheads = d_inner // headdim``. Defaults to 64.
        ngroups (int): groups sharing B and C. Defaults to 1.
        A_init_range (tuple): ``A = -U(*A_init_range)`` at init. Defaults to (1, 16).
        dt_min, dt_max, dt_init_floor (float): dt bias init. Defaults to 1e-3, 0.1, 1e-4.
        chunk_size (int): chunk length of the Triton scan (CUDA); the portable scans choose
            their own blocks. Defaults to 256.
        bias (bool): biases of in/out projections. Defaults to False.
        conv_bias (bool): conv biases. Defaults to True.
        rmsnorm (bool): gated RMSNorm per direction; False gates with ``silu(z)`` only.
            Defaults to True.
        norm_eps (float): RMSNorm epsilon. Defaults to 1e-5.
        fast_path (bool): see above. Defaults to True.
        backend (str): SSD backend of the scan (see :func:`mmdinomamba.ops.ssd_scan`); ``'ref'``
            (the sequential recurrence) implies the specification. Defaults to 'auto'.
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
                 fast_path: bool = True,
                 backend: str = 'auto',
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
        self.chunk_size, self.fast_path, self.backend = chunk_size, fast_path, backend
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

    def _splits(self) -> tuple[int, int, int]:
        """Conv channel segments (x, B, C) of one direction."""
        gn = self.ngroups * self.d_state
        return self.d_inner, gn, gn

    def _direction_params(self, dt: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Raw ``dt`` (B, L, 2h) of both directions (backward heads on the flipped sequence),
        their ``dt_bias`` (2h,), ``A`` (2h,) in float32 or better and ``D`` (2h,)."""
        ct = torch.promote_types(dt.dtype, torch.float32)
        A = -torch.exp(torch.cat([self.A_log, self.A_log_b]).to(ct))
        return (torch.cat([dt, dt.flip(1)], dim=-1), torch.cat([self.dt_bias, self.dt_b_bias]),
                A, torch.cat([self.D, self.D_b]))

    # ---- forward ------------------------------------------------------------------------------
    def forward(self, x: Tensor, hw: tuple[int, int] | None = None) -> Tensor:
        """Mix tokens ``x`` (B, L, C) -> (B, L, C). ``hw`` is unused (1-D scan over L)."""
        proj = self.in_proj(x)
        if self.fast_path and self.backend != 'ref':
            if _triton.on_kernel_device(proj):
                return self._forward_kernels(proj)
            if self.backend != 'triton' and self._quadratic_pays(proj):
                return self._inner(proj)
        z, xBC, dt = self._split(proj)
        return self._merge_out(self._scan(*self._scan_inputs(xBC, dt)).flatten(2), z)

    def _quadratic_pays(self, proj: Tensor) -> bool:
        """Whether the CPU fast path (scan in the quadratic form) is faster than the chunked
        scan for this input (:func:`~mmdinomamba.ops.use_quadratic_form`)."""
        by_length = quadratic_form_by_length(proj.shape[1], self.headdim, self.d_state)
        if by_length is not None:  # no step sizes needed (e.g. the demo's crops)
            return by_length
        with torch.no_grad():
            dt, dt_bias, A, _ = self._direction_params(proj[..., -self.num_heads:])
            dt = F.softplus(dt.float() + dt_bias.float())
            return use_quadratic_form(dt, A, self.headdim, self.d_state)

    def _inner(self, proj: Tensor) -> Tensor:
        """CPU fast path: ``out_proj`` of :func:`~mmdinomamba.ops.bidir_ssd_inner` of the
        projection, the projection inside that function where it can be (a plain ``nn.Linear``
        without hooks, no autocast, one dtype), so that its input is rebuilt in the backward
        pass instead of kept."""
        norm = torch.stack([self.norm.weight, self.norm_b.weight]) if self.rmsnorm else None
        weight = self.out_proj.weight
        inside = (_plain_linear(self.out_proj) and not torch.is_autocast_enabled(proj.device.type)
                  and proj.dtype == weight.dtype and proj.dtype in (torch.float32, torch.float64))
        mixed = bidir_ssd_inner(proj, *self._conv_params(),
                                torch.stack([self.dt_bias, self.dt_b_bias]),
                                -torch.exp(torch.stack([self.A_log, self.A_log_b])),
                                torch.stack([self.D, self.D_b]), norm, self.dims,
                                *((weight, self.out_proj.bias) if inside else ()))
        return mixed if inside else self.out_proj(mixed)

    def _forward_kernels(self, proj: Tensor) -> Tensor:
        """CUDA fast path (the pieces as chosen by :func:`~mmdinomamba.ops.fast_path_variant`)."""
        v = current_variant()
        z, xBC, dt = self._split(proj)
        if v.fused_conv and v.single_scan and v.recompute_conv:
            y = bidir_conv_scan(xBC, *self._conv_params(), *self._direction_params(dt),
                                self._splits(), self.headdim, self.d_state, self.chunk_size,
                                self.backend)
        else:
            y = self._scan(*self._scan_inputs(xBC, dt))  # backward heads in flipped order
        y = y.flatten(2)
        if v.fused_merge and v.recompute_merge and torch.is_grad_enabled():
            # keep y and z (kept by the scan and the conv anyway), not the merged output; the
            # kernel is chosen here, outside the checkpoint (its first lookup runs a self-check),
            # and the recomputation replays it even if the dispatch has changed by then
            kernel = _triton.bidir_merge_fn() if _triton.on_kernel_device(y) else None
            if kernel is not None:
                return checkpoint(self._merge_out, y, z, kernel, use_reentrant=False)
        return self._merge_out(y, z)

    def _scan_inputs(self, xBC: Tensor, dt: Tensor):
        """Both directions as one SSD problem of 2*nheads heads and 2*ngroups groups.

        Heads ``[0, h)`` are the forward direction in token order; heads ``[h, 2h)`` the backward
        direction on the flipped sequence. Returns ``u`` (B, L, 2h, p), ``dt`` (B, L, 2h) after
        softplus, ``A`` (2h,), ``B``, ``C`` (B, L, 2g, n) and ``D`` (2h,).
        """
        # channels [x_f, x_b, B_f, B_b, C_f, C_b], backward parts in flipped time order
        fused = self.fast_path and current_variant().fused_conv
        conv_fn = bidir_causal_conv1d if fused else bidir_causal_conv1d_portable
        dt, dt_bias, A, D = self._direction_params(dt)
        u, dt, Bm, Cm = conv_scan_inputs(xBC, *self._conv_params(), dt, dt_bias, self._splits(),
                                         self.headdim, self.d_state, conv_fn)
        return u, dt, A, Bm, Cm, D

    def _scan(self, u, dt, A, Bm, Cm, D) -> Tensor:
        """(B, L, 2h, p) outputs of both directions, in one or two scan calls."""
        kw = dict(chunk_size=self.chunk_size, backend=self.backend)
        if current_variant().single_scan:
            return ssd_scan(u, dt, A, Bm, Cm, D, **kw)
        h, g = self.num_heads, self.ngroups
        return torch.cat([
            ssd_scan(u[:, :, s], dt[:, :, s], A[s], Bm[:, :, sg], Cm[:, :, sg], D[s], **kw)
            for s, sg in ((slice(0, h), slice(0, g)), (slice(h, None), slice(g, None)))
        ],
                         dim=2)

    def _merge_out(self, y: Tensor, z: Tensor, kernel=None) -> Tensor:
        """``out_proj`` of the merged directions (y (B, L, 2 d_inner), backward half flipped);
        ``kernel``: our merge kernel, pinned (default: as the fast path and its variant say)."""
        if kernel is not None:
            merge = functools.partial(bidir_gated_merge, kernel=kernel)
        elif self.fast_path and current_variant().fused_merge:
            merge = bidir_gated_merge
        else:
            merge = bidir_gated_merge_portable
        if self.rmsnorm:  # (norm(y_f, z) + norm_b(flip(y_b), z)) / 2
            weight = torch.stack([self.norm.weight, self.norm_b.weight])
            mixed = merge(y, z, weight, self.norm.eps, self.norm.group_size)
        else:  # (y_f + flip(y_b)) / 2 * silu(z)
            mixed = merge(y, z, None)
        return self.out_proj(mixed)
