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
from torch.utils.checkpoint import checkpoint

from mmdinomamba.ops import (_triton, bidir_causal_conv1d, bidir_conv_scan, bidir_gated_merge,
                             gated_rms_norm, ssd_decay_matrix, ssd_mixing_matrix, ssd_scan)
from mmdinomamba.ops.bidir_conv import bidir_causal_conv1d_portable
from mmdinomamba.ops.bidir_conv_scan import conv_scan_inputs
from mmdinomamba.ops.bidir_merge import bidir_gated_merge_portable

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
class BiSSD(BaseModule):
    """Bidirectional Mamba-2 mixer: ``out_proj((y_fwd + flip(y_bwd)) / 2)``.

    One shared ``in_proj`` (output order z, x, B, C, dt) and one shared ``out_proj``. The forward
    direction uses ``conv1d, dt_bias, A_log, D, norm``; the backward direction has its own
    ``conv1d_b, dt_b_bias, A_log_b, D_b, norm_b`` and runs on the sequence-flipped projection.
    Parameter names equal the official Dino-Mamba ``Mamba2`` (``bimamba_type='v2'``) keys, so
    its checkpoints load without renaming. Both directions are always computed; on every
    backend they run as ONE scan of ``2 * nheads`` heads (backward heads on the flipped
    sequence, ``2 * ngroups`` groups), or as two scans with ``single_scan=False`` (same result).

    Args:
        embed_dims (int): token channels ``d_model``.
        d_state (int): SSM state size ``n``. Defaults to 64.
        d_conv (int): causal conv kernel. Defaults to 4.
        expand (int): ``d_inner = expand * embed_dims``. Defaults to 2.
        headdim (int): channels per head; ``nheads = d_inner // headdim``. Defaults to 64.
        ngroups (int): groups sharing B and C. Defaults to 1.
        A_init_range (tuple): ``A = -U(*A_init_range)`` at init. Defaults to (1, 16).
        dt_min, dt_max, dt_init_floor (float): dt bias init. Defaults to 1e-3, 0.1, 1e-4.
        chunk_size (int): chunk size of the Triton scan. Defaults to 256.
        bias (bool): biases of in/out projections. Defaults to False.
        conv_bias (bool): conv biases. Defaults to True.
        rmsnorm (bool): gated RMSNorm per direction; False gates with ``silu(z)`` only.
            Defaults to True.
        norm_eps (float): RMSNorm epsilon. Defaults to 1e-5.
        single_scan (bool): both directions in one scan call. Defaults to True.
        fused_conv (bool): on CUDA, both directions' conv + SiLU in our fused Triton kernel
            (:func:`~mmdinomamba.ops.bidir_causal_conv1d`); False keeps the flip / cat /
            depthwise-conv composition (for A/B timing). Same result. Defaults to True.
        fused_merge (bool): on CUDA, un-flip + both gated RMSNorms + average in our fused
            Triton kernel (:func:`~mmdinomamba.ops.bidir_gated_merge`); False keeps the
            flip / two norms / add composition (for A/B timing). Same result up to rounding.
            Defaults to True.
        recompute_conv (bool): on CUDA with ``fused_conv`` and ``single_scan``, the conv and
            the scan of both directions run as one autograd function that recomputes the conv
            in the backward pass instead of keeping its output
            (:func:`~mmdinomamba.ops.bidir_conv_scan`; about a quarter less activation memory
            per layer for one extra conv). Same result. Defaults to True.
        recompute_merge (bool): on CUDA with ``fused_merge``, while training, recompute the
            merged output in the backward pass instead of keeping it for ``out_proj`` (its
            inputs are kept anyway; one extra merge kernel). Same result. Defaults to True.
        backend (str): SSD backend (see :func:`mmdinomamba.ops.ssd_scan`). Defaults to 'auto'.
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
                 single_scan: bool = True,
                 fused_conv: bool = True,
                 fused_merge: bool = True,
                 recompute_conv: bool = True,
                 recompute_merge: bool = True,
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
        self.embed_dims, self.d_inner, self.d_state = embed_dims, d_inner, d_state
        self.headdim, self.ngroups, self.num_heads = headdim, ngroups, d_inner // headdim
        self.chunk_size, self.single_scan, self.backend = chunk_size, single_scan, backend
        self.fused_conv, self.fused_merge = fused_conv, fused_merge
        self.recompute_conv, self.recompute_merge = recompute_conv, recompute_merge
        self.rmsnorm = rmsnorm
        h, conv_dim = self.num_heads, d_inner + 2 * ngroups * d_state
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

    def _project(self, x: Tensor):
        """in_proj -> z (B, L, d_inner), xBC (B, L, conv_dim), dt (B, L, nheads)."""
        conv_dim = self.d_inner + 2 * self.ngroups * self.d_state
        return self.in_proj(x).split([self.d_inner, conv_dim, self.num_heads], dim=-1)

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

    def _scan_inputs(self, xBC: Tensor, dt: Tensor):
        """Both directions as one SSD problem of 2*nheads heads and 2*ngroups groups.

        Heads ``[0, h)`` are the forward direction in token order; heads ``[h, 2h)`` the backward
        direction on the flipped sequence. Returns ``u`` (B, L, 2h, p), ``dt`` (B, L, 2h) after
        softplus, ``A`` (2h,), ``B``, ``C`` (B, L, 2g, n) and ``D`` (2h,).
        """
        # channels [x_f, x_b, B_f, B_b, C_f, C_b], backward parts in flipped time order
        conv_fn = bidir_causal_conv1d if self.fused_conv else bidir_causal_conv1d_portable
        dt, dt_bias, A, D = self._direction_params(dt)
        u, dt, Bm, Cm = conv_scan_inputs(xBC, *self._conv_params(), dt, dt_bias, self._splits(),
                                         self.headdim, self.d_state, conv_fn)
        return u, dt, A, Bm, Cm, D

    def _scan(self, u, dt, A, Bm, Cm, D) -> Tensor:
        """(B, L, 2h, p) outputs of both directions, in one or two scan calls."""
        kw = dict(chunk_size=self.chunk_size, backend=self.backend)
        if self.single_scan:
            return ssd_scan(u, dt, A, Bm, Cm, D, **kw)
        h, g = self.num_heads, self.ngroups
        return torch.cat([
            ssd_scan(u[:, :, s], dt[:, :, s], A[s], Bm[:, :, sg], Cm[:, :, sg], D[s], **kw)
            for s, sg in ((slice(0, h), slice(0, g)), (slice(h, None), slice(g, None)))
        ],
                         dim=2)

    def forward(self, x: Tensor, hw: tuple[int, int] | None = None) -> Tensor:
        """Mix tokens ``x`` (B, L, C) -> (B, L, C). ``hw`` is unused (1-D scan over L)."""
        z, xBC, dt = self._project(x)
        if self.fused_conv and self.single_scan and self.recompute_conv:
            y = bidir_conv_scan(xBC, *self._conv_params(), *self._direction_params(dt),
                                self._splits(), self.headdim, self.d_state, self.chunk_size,
                                self.backend)
        else:
            y = self._scan(*self._scan_inputs(xBC, dt))  # backward heads in flipped order
        y = y.flatten(2)
        if (self.fused_merge and self.recompute_merge and torch.is_grad_enabled()
                and _triton.on_kernel_device(y)):
            # keep y and z (kept by the scan and the conv anyway), not the merged output
            return checkpoint(self._merge_out, y, z, use_reentrant=False)
        return self._merge_out(y, z)

    def _merge_out(self, y: Tensor, z: Tensor) -> Tensor:
        """``out_proj`` of the merged directions (y (B, L, 2 d_inner), backward half flipped)."""
        merge = bidir_gated_merge if self.fused_merge else bidir_gated_merge_portable
        if self.rmsnorm:  # (norm(y_f, z) + norm_b(flip(y_b), z)) / 2
            weight = torch.stack([self.norm.weight, self.norm_b.weight])
            mixed = merge(y, z, weight, self.norm.eps, self.norm.group_size)
        else:  # (y_f + flip(y_b)) / 2 * silu(z)
            mixed = merge(y, z, None)
        return self.out_proj(mixed)

    def _problem(self, x: Tensor) -> tuple:
        """``z`` and the scan problem of both directions for the analysis methods."""
        z, xBC, dt = self._project(x)
        return (z, ) + self._scan_inputs(xBC, dt)

    @torch.no_grad()
    def mixing_matrices(self, x: Tensor, hw: tuple[int, int] | None = None) -> dict:
        """Each direction's matrix and the values it is applied to: the EXACT per-direction map.

        Returns a dict (all in the ORIGINAL token order):

        * ``forward``, ``backward``: (B, nheads, L, L) ``M`` of each direction including its
          ``D`` on the diagonal; ``forward`` is lower and ``backward`` upper triangular;
        * ``value_forward``, ``value_backward``: (B, L, nheads, headdim) the conv outputs each
          direction scans (they differ: each direction has its own causal conv);
        * ``gate``: (B, L, d_inner) ``z``.

        Exactly (up to rounding): ``M_dir @ value_dir`` per head is that direction's scan
        output before its gated RMSNorm, ``y_dir``; the mixer output is
        ``out_proj((norm(y_fwd, z) + norm_b(y_bwd, z)) / 2)`` (with ``rmsnorm=False``:
        ``out_proj((y_fwd + y_bwd) / 2 * silu(z))``).
        """
        z, u, dt, A, Bm, Cm, D = self._problem(x)
        h, g = self.num_heads, self.ngroups
        mats, ct = [], dt.dtype
        for s, sg in ((slice(0, h), slice(0, g)), (slice(h, None), slice(g, None))):
            M = ssd_mixing_matrix(dt[:, :, s], A[s], Bm[:, :, sg].to(ct), Cm[:, :, sg].to(ct))
            mats.append(M + torch.diag_embed(D[s].to(ct)[:, None].expand(-1, M.shape[-1])))
        return dict(
            forward=mats[0],
            backward=mats[1].flip(-1).flip(-2),
            value_forward=u[:, :, :h],
            value_backward=u[:, :, h:].flip(1),
            gate=z)

    @torch.no_grad()
    def decay_masks(self, x: Tensor, hw: tuple[int, int] | None = None) -> dict:
        """Each direction's decay mask ``L_M`` (Mamba-2's learnable causal mask), float64.

        Returns:
            dict: ``forward`` (B, nheads, L, L) lower triangular,
            ``L[i, j] = exp(sum_{k=j+1..i} dt_k A)``, so that ``mixing_matrices(x)['forward']``
            is ``L o (C B^T) o dt_j`` below the diagonal; ``backward`` the same for the backward
            direction in the original token order (upper triangular). Ones on the diagonals.
        """
        _, _, dt, A = self._problem(x)[:4]
        h = self.num_heads
        return dict(forward=ssd_decay_matrix(dt[..., :h], A[:h]),
                    backward=ssd_decay_matrix(dt[..., h:], A[h:]).flip(-1).flip(-2))

    @torch.no_grad()
    def mixing_matrix(self, x: Tensor, hw: tuple[int, int] | None = None) -> Tensor:
        """``M = (M_fwd + M_bwd) / 2`` (B, nheads, L, L): the two directions' matrices averaged.

        This is the combined map that Binary-AUC and the rank analysis read for BiSSD (Mamba's
        "hidden attention": the forward direction below the diagonal, the backward one above
        it, the mean of both ``D``-augmented diagonals on it). It is NOT an exact map of the
        mixer's input to its output: the two directions scan different values (each has its own
        causal conv) and each direction's gated RMSNorm sits between its scan and the average,
        so neither ``M @ value_forward`` nor any single ``M @ v`` reproduces the output in
        general. It is exact only without the norm (``rmsnorm=False``) AND with equal values in
        both directions, where ``out_proj((M @ v) * silu(z))`` is the output. The exact
        per-direction maps are :meth:`mixing_matrices`.
        """
        mats = self.mixing_matrices(x, hw)
        return (mats['forward'] + mats['backward']) / 2
