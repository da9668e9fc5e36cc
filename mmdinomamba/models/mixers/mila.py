"""Mamba-like linear attention: linear attention with Mamba's six designs as switches.

"Demystify Mamba in Vision: A Linear Attention Perspective" (Han et al., NeurIPS 2024,
https://arxiv.org/abs/2405.16605) writes Mamba as linear attention with six differences. Each is
an independent switch of :class:`MambaLikeLinearAttention`:

1. ``input_gate``: a per-token, per-head input scale ``Delta = softplus(x W + b)`` on the values.
2. ``forget_gate``: a per-token, per-head decay ``exp(dt A)`` (Mamba-2 parametrization), computed
   by the SSD scan with ``B = phi(K)``, ``C = phi(Q)`` (``direction`` 'causal' or 'bi'). With both
   gates on they share one ``Delta = dt``, exactly Mamba-2's SSD.
3. ``shortcut``: ``+ D * v`` (``D`` per channel, ones at init).
4. ``normalize``: attention normalization ``/ (q . sum k)`` on or off.
5. ``num_heads`` / ``qk_dim``: multi-head (``num_heads > 1``) or a single head with a small
   query/key width (Mamba's ``d_state``), e.g. ``num_heads=1, qk_dim=16``.
6. ``block_design``: ``'vit'`` (q/k/v projections -> attention -> out projection) or ``'mamba'``
   (``in_proj -> dw conv -> SiLU -> attention``, times ``SiLU(act_proj(x))``, ``-> out_proj``;
   values are the conv features, no v projection: MILA).

Positional options inside the mixer: ``rope`` (2-D RoPE on the kernelized q/k in the numerator
only) and ``lepe`` (depthwise 3x3 conv on the values, added to the output). APE and CPE live in the
backbone / block.

``mixing_matrix`` returns the exact per-head ``M`` with ``attention(x)['mixed'] == M @ v`` for every
switch combination. It excludes what is not a per-head token mixing of ``v``: the shortcut
``D * v``, LePE (per-channel local conv of ``v``), the SiLU gate and the projections; the values
``v`` are the q/k/v-projected (``'vit'``) or conv-SiLU (``'mamba'``) features.
"""
import math
from typing import Optional, Tuple

import torch
from mmpretrain.registry import MODELS
from torch import Tensor, nn

from mmdinomamba.models.utils.rope import apply_rope_2d
from .mila_core import (KERNELS, decayed_attention, decayed_mixing, feature_map, global_attention,
                        global_mixing)

__all__ = ['MambaLikeLinearAttention']


def _grid(length: int, hw: Optional[Tuple[int, int]]) -> Tuple[int, int]:
    """The token grid: ``hw`` (checked) or the square grid of ``length`` tokens."""
    if hw is None:
        side = math.isqrt(length)
        if side * side != length:
            raise ValueError(f'hw is needed for {length} tokens (not a square grid)')
        return side, side
    h, w = int(hw[0]), int(hw[1])
    if h * w != length:
        raise ValueError(f'hw={tuple(hw)} does not match the {length} tokens (spatial options '
                         'need patch tokens only)')
    return h, w


def _dwconv(conv: nn.Conv2d, x: Tensor, hw: Tuple[int, int]) -> Tensor:
    """Depthwise conv of tokens as an image: x (B, L, C) -> (B, L, C)."""
    b, _, c = x.shape
    img = x.transpose(1, 2).reshape(b, c, *hw)
    return conv(img).flatten(2).transpose(1, 2)


@MODELS.register_module()
class MambaLikeLinearAttention(nn.Module):
    """Linear attention with Mamba's designs as switches (see the module docstring).

    Args:
        embed_dims (int): channels ``C``.
        num_heads (int): heads ``h`` (of q/k, values, gates and ``M``). Defaults to 8.
        qk_dim (int, optional): query/key width per head ``n``. Defaults to ``C // h``.
        kernel (str): ``phi``: 'elu' (ELU+1), 'relu', 'softmax' or 'identity'. Defaults to 'elu'.
        qkv_bias (bool): bias of the q/k (and v) projections. Defaults to True.
        v_proj (bool, optional): project values (else ``v`` = attention input). Defaults to True
            for 'vit' and False for 'mamba'.
        out_proj (bool): output projection in the 'vit' design ('mamba' always has one).
            Defaults to True.
        block_design (str): 'vit' or 'mamba'. Defaults to 'vit'.
        input_gate (bool): design (1). Defaults to False.
        forget_gate (bool): design (2). Defaults to False.
        direction (str): forget-gate scan, 'bi' or 'causal' (without the forget gate attention
            is global). Defaults to 'bi'.
        shortcut (bool): design (3), ``+ D * v``. Defaults to False.
        normalize (bool): design (4), attention normalization. Defaults to True.
        rope (bool): 2-D RoPE on ``phi(q), phi(k)`` in the numerator. Defaults to False.
        lepe (bool): LePE, depthwise 3x3 conv of ``v`` added to the output. Defaults to False.
        eps (float): normalizer epsilon. Defaults to 1e-6.
        chunk_size (int): SSD chunk size. Defaults to 256.
        dt_range (tuple[float, float]): initial ``dt`` range (log-uniform). Defaults to
            (1e-3, 1e-1).
        A_range (tuple[float, float]): initial ``-A`` range (uniform). Defaults to (1, 16).
    """

    def __init__(self, embed_dims: int, num_heads: int = 8, qk_dim: Optional[int] = None,
                 kernel: str = 'elu', qkv_bias: bool = True, v_proj: Optional[bool] = None,
                 out_proj: bool = True, block_design: str = 'vit', input_gate: bool = False,
                 forget_gate: bool = False, direction: str = 'bi', shortcut: bool = False,
                 normalize: bool = True, rope: bool = False, lepe: bool = False,
                 eps: float = 1e-6, chunk_size: int = 256, dt_range=(1e-3, 1e-1),
                 A_range=(1., 16.)):
        super().__init__()
        if embed_dims % num_heads:
            raise ValueError(f'embed_dims={embed_dims} is not divisible by num_heads={num_heads}')
        if kernel not in KERNELS:
            raise ValueError(f'kernel must be one of {KERNELS}, got {kernel!r}')
        if block_design not in ('vit', 'mamba'):
            raise ValueError(f"block_design must be 'vit' or 'mamba', got {block_design!r}")
        if direction not in ('bi', 'causal'):
            raise ValueError(f"direction must be 'bi' or 'causal', got {direction!r}")
        self.embed_dims, self.num_heads = embed_dims, num_heads
        self.qk_dim = qk_dim or embed_dims // num_heads
        if rope and (num_heads * self.qk_dim) % 4:
            raise ValueError(f'rope needs num_heads * qk_dim divisible by 4, got '
                             f'{num_heads} * {self.qk_dim}')
        self.kernel, self.block_design, self.direction = kernel, block_design, direction
        self.input_gate, self.forget_gate = input_gate, forget_gate
        self.normalize, self.rope, self.eps, self.chunk_size = normalize, rope, eps, chunk_size
        c = embed_dims
        if block_design == 'mamba':
            self.in_proj, self.act_proj = nn.Linear(c, c), nn.Linear(c, c)
            self.dwc = nn.Conv2d(c, c, 3, padding=1, groups=c)
            self.act = nn.SiLU()
        self.qk = nn.Linear(c, 2 * num_heads * self.qk_dim, bias=qkv_bias)
        use_v = (block_design == 'vit') if v_proj is None else v_proj
        self.v = nn.Linear(c, c, bias=qkv_bias) if use_v else None
        if input_gate or forget_gate:
            self._init_gates(dt_range, A_range)
        self.D = nn.Parameter(torch.ones(c)) if shortcut else None
        self.lepe = nn.Conv2d(c, c, 3, padding=1, groups=c) if lepe else None
        use_out = block_design == 'mamba' or out_proj
        self.out_proj = nn.Linear(c, c) if use_out else nn.Identity()

    def _init_gates(self, dt_range, A_range) -> None:
        """Mamba-2 initialization: ``softplus(dt_bias)`` log-uniform in ``dt_range``."""
        h = self.num_heads
        self.dt_proj = nn.Linear(self.embed_dims, h, bias=False)
        dt = torch.exp(torch.rand(h) * (math.log(dt_range[1]) - math.log(dt_range[0])) +
                       math.log(dt_range[0]))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        if self.forget_gate:
            self.A_log = nn.Parameter(torch.log(torch.empty(h).uniform_(*A_range)))

    def _prepare(self, x: Tensor, hw) -> dict:
        """Everything before the token mixing: gate branch, q/k (kernelized, rotated), v, dt."""
        b, length, c = x.shape
        spatial = self.block_design == 'mamba' or self.rope or self.lepe is not None
        grid = _grid(length, hw) if spatial else None
        parts = dict(hw=grid, gate=None)
        if self.block_design == 'mamba':
            parts['gate'] = self.act(self.act_proj(x))
            x = self.act(_dwconv(self.dwc, self.in_proj(x), grid))
        h, n = self.num_heads, self.qk_dim
        q, k = feature_map(self.qk(x).reshape(b, length, 2, h, n), self.kernel).unbind(2)
        qr, kr = q, k
        if self.rope:
            qr = apply_rope_2d(q.reshape(b, length, h * n), grid).reshape(b, length, h, n)
            kr = apply_rope_2d(k.reshape(b, length, h * n), grid).reshape(b, length, h, n)
        v = x if self.v is None else self.v(x)
        parts.update(q=q, k=k, qr=qr, kr=kr, v=v.reshape(b, length, h, c // h))
        if self.input_gate or self.forget_gate:
            parts['dt'] = nn.functional.softplus(self.dt_proj(x) + self.dt_bias)
        return parts

    def _gate_args(self, parts: dict) -> dict:
        """Keyword arguments of the core functions for the active gates."""
        args = dict(q=parts['q'], k=parts['k'], qr=parts['qr'], kr=parts['kr'],
                    normalize=self.normalize, eps=self.eps)
        if not self.forget_gate:
            return dict(args, gate=parts['dt'] if self.input_gate else None)
        dt = parts['dt']
        in_scale = None if self.input_gate else 1. / dt  # tied gates: Mamba's shared Delta
        A = -torch.exp(self.A_log.to(torch.promote_types(self.A_log.dtype, torch.float32)))
        return dict(args, dt=dt, A=A,
                    in_scale=in_scale, direction=self.direction)

    def attention(self, x: Tensor, hw=None) -> dict:
        """Run up to the token mixing.

        Args:
            x (Tensor): (B, L, C) mixer input.
            hw (tuple[int, int], optional): token grid, needed by spatial options.

        Returns:
            dict: ``v`` (B, L, h, p) values, ``mixed`` (B, L, h, p) ``= M @ v``, ``gate``
            (B, L, C) SiLU gate or None, ``hw`` the grid or None.
        """
        parts = self._prepare(x, hw)
        args = self._gate_args(parts)
        if self.forget_gate:
            mixed = decayed_attention(v=parts['v'], chunk_size=self.chunk_size, **args)
        else:
            mixed = global_attention(v=parts['v'], **args)
        return dict(v=parts['v'], mixed=mixed, gate=parts['gate'], hw=parts['hw'])

    def forward(self, x: Tensor, hw=None) -> Tensor:
        """x: (B, L, C) -> (B, L, C); ``hw`` is the token grid (needed by spatial options)."""
        out = self.attention(x, hw)
        b, length, c = x.shape
        v, y = out['v'].reshape(b, length, c), out['mixed'].reshape(b, length, c)
        if self.D is not None:
            y = y + v * self.D
        if self.lepe is not None:
            y = y + _dwconv(self.lepe, v, out['hw'])
        if out['gate'] is not None:
            y = y * out['gate']
        return self.out_proj(y)

    def mixing_matrix(self, x: Tensor, hw=None) -> Tensor:
        """The exact ``M`` (B, num_heads, L, L) with ``attention(x, hw)['mixed'] = M @ v``."""
        parts = self._prepare(x, hw)
        args = self._gate_args(parts)
        return decayed_mixing(**args) if self.forget_gate else global_mixing(**args)

    def extra_repr(self) -> str:
        on = [k for k in ('input_gate', 'forget_gate', 'normalize', 'rope') if getattr(self, k)]
        return (f'embed_dims={self.embed_dims}, num_heads={self.num_heads}, qk_dim={self.qk_dim}, '
                f'kernel={self.kernel}, block_design={self.block_design}, on={on}')
