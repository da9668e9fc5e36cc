"""DinoVim and MambaReg presets: bidirectional Mamba-2 (SSD) blocks on the plain trunk."""
import math

import torch
from mmpretrain.registry import MODELS
from torch import Tensor, nn

from ...ops import RMSNorm
from ..mixers import BiSSD
from ..utils import CheckpointMismatchError
from .base import PlainBackbone
from .blocks import Block
from .layout import (LAYOUT_METADATA_KEY, LEGACY_DINOMAMBA, MIDDLE_CLS, REGISTERS, TokenLayout,
                     legacy_dinomamba_layout, middle_cls_layout, register_layout)

__all__ = ['DinoVim', 'MambaReg']

_VIM_ZOO = {
    **dict.fromkeys(['t', 'tiny'], dict(embed_dims=256, num_layers=24)),
    **dict.fromkeys(['s', 'small'], dict(embed_dims=512, num_layers=24)),
    **dict.fromkeys(['b', 'base'], dict(embed_dims=768, num_layers=24)),
}


def _lecun_normal_(weight: Tensor) -> None:
    """Truncated normal with variance ``1 / fan_in`` (timm's ``lecun_normal_``)."""
    fan_in = weight[0].numel()
    nn.init.trunc_normal_(weight, std=math.sqrt(1. / fan_in) / .87962566103423978)


@MODELS.register_module()
class DinoVim(PlainBackbone):
    """DinoVim (Dino-Mamba's Vision Mamba-2): ``norm1 (RMSNorm) -> BiSSD`` blocks, no MLP.

    Settings of the released models: 24 layers, widths 256/512/768 (``'t'/'s'/'b'``:
    ~10.71M / 40.35M / 88.97M parameters), RMSNorm eps 1e-5, residual stream in float32,
    drop path 0.1, bidirectional Mamba-2 mixer (:class:`BiSSD`, d_state 64, headdim 64,
    expand 2, chunk 256). A dict arch needs ``embed_dims, num_layers``; mixer options go in
    ``mixer_cfg`` (e.g. ``dict(d_state=16, headdim=16)`` for tiny test models).

    Token layouts (``pos_embed`` is the patch grid, ``pos_embed_cls`` the cls position):

    * clean (default): ONE cls token (``cls_token + pos_embed_cls``) in the middle of the
      patches, at index ``N // 2`` (98 of L = 197 for 14x14 patches).
    * ``legacy_dinomamba_layout=True``: the released Dino-Mamba sequence, L = N + 2: the cls
      token with ``pos_embed_cls`` at index 0, then the patches, and the cls token AGAIN
      (without position) inserted at ``(N + 1) // 2`` (98 of 198); the output is the middle
      one. Converted official checkpoints (``tools/model_converters/dinomamba2mmdm.py``)
      compute exactly what they computed in this mode; Dino-Mamba's linear-probe features
      are ``get_intermediate_layers(x, n, source='mixer')``.

    Both layouts have the same parameters, so a checkpoint would load into either and silently
    compute other features. The state dict therefore records the layout (``token_layout`` in
    its ``_metadata``: ``'middle_cls'``, ``'legacy_dinomamba'``, or ``'registers'`` for
    :class:`MambaReg`; the converter records ``'legacy_dinomamba'``), and loading weights
    recorded with another layout raises :class:`~mmdinomamba.models.utils.
    CheckpointMismatchError` saying which option to set. Weights without a record (older
    files) load as before.

    Args:
        arch (str | dict): see above. Defaults to 'b'.
        mixer_cfg (dict, optional): extra :class:`BiSSD` keywords. Defaults to None.
        legacy_dinomamba_layout (bool): see above. Defaults to False.
        norm_eps (float): RMSNorm epsilon. Defaults to 1e-5.
        drop_path_rate (float): Defaults to 0.1.
        residual_in_fp32 (bool): Defaults to True.
        **kwargs: trunk options of :class:`PlainBackbone`.
    """
    arch_zoo = _VIM_ZOO
    arch_keys = ('embed_dims', 'num_layers')

    def __init__(self, arch='b', mixer_cfg=None, legacy_dinomamba_layout=False, norm_eps=1e-5,
                 drop_path_rate=0.1, residual_in_fp32=True, **kwargs):
        self.mixer_cfg = dict(mixer_cfg or {})
        self.legacy_dinomamba_layout, self.norm_eps = legacy_dinomamba_layout, norm_eps
        super().__init__(arch, drop_path_rate=drop_path_rate, residual_in_fp32=residual_in_fp32,
                         **kwargs)

    def _build_norm(self) -> nn.Module:
        return RMSNorm(self.embed_dims, eps=self.norm_eps)

    def _build_block(self, index: int, drop_path: float) -> nn.Module:
        return Block(self._build_norm(), BiSSD(self.embed_dims, **self.mixer_cfg), drop_path)

    def _init_params(self) -> None:
        """Dino-Mamba's init: lecun-normal patch conv, GPT-2 scaled ``out_proj`` of each mixer."""
        super()._init_params()
        _lecun_normal_(self.patch_embed.proj.weight)
        nn.init.zeros_(self.patch_embed.proj.bias)
        for layer in self.layers:
            out_proj = getattr(layer.mixer, 'out_proj', None)
            if isinstance(out_proj, nn.Linear):
                nn.init.kaiming_uniform_(out_proj.weight, a=math.sqrt(5))
                with torch.no_grad():
                    out_proj.weight /= math.sqrt(self.num_layers)

    def _special_tokens(self, batch: int) -> Tensor:
        if not self.legacy_dinomamba_layout:
            return super()._special_tokens(batch)
        # [middle cls without position, front cls with its position] (layout order)
        return torch.cat([self.cls_token, self.cls_token + self.pos_embed_cls],
                         dim=1).expand(batch, -1, -1)

    def token_layout(self, hw: tuple[int, int]) -> TokenLayout:
        """Middle cls (L = N + 1), or the legacy Dino-Mamba layout (L = N + 2)."""
        if self.legacy_dinomamba_layout:
            return legacy_dinomamba_layout(*hw)
        return middle_cls_layout(*hw)

    @property
    def token_layout_name(self) -> str:
        """The layout recorded in state dicts: 'middle_cls' or 'legacy_dinomamba'."""
        return LEGACY_DINOMAMBA if self.legacy_dinomamba_layout else MIDDLE_CLS

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        metadata = getattr(destination, '_metadata', None)
        if metadata is not None:
            metadata.setdefault(prefix[:-1], {})[LAYOUT_METADATA_KEY] = self.token_layout_name

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args, **kwargs):
        recorded = local_metadata.get(LAYOUT_METADATA_KEY)
        if recorded is not None and recorded != self.token_layout_name:
            raise CheckpointMismatchError(self._layout_mismatch(recorded))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args, **kwargs)

    def _layout_mismatch(self, recorded: str) -> str:
        """What to tell a user loading weights of the layout ``recorded``."""
        name, own = type(self).__name__, self.token_layout_name
        what = {LEGACY_DINOMAMBA: 'an official Dino-Mamba checkpoint converted by '
                'tools/model_converters/dinomamba2mmdm.py, whose cls token sits at the front '
                'and again in the middle',
                MIDDLE_CLS: 'a DinoVim with one middle cls token',
                REGISTERS: 'a MambaReg (register tokens)'}.get(recorded, 'another model')
        fix = {LEGACY_DINOMAMBA: 'set legacy_dinomamba_layout=True in the backbone config '
               '(e.g. --cfg-options model.backbone.legacy_dinomamba_layout=True)',
               MIDDLE_CLS: "set legacy_dinomamba_layout=False (type='DinoVim')",
               REGISTERS: "use type='MambaReg'"}.get(recorded, 'use the layout of the weights')
        return (f'the weights were saved with the token layout {recorded!r} ({what}) but this '
                f'{name} uses {own!r}: it would compute different features from the same '
                f'weights. To reproduce that model, {fix}.')


@MODELS.register_module()
class MambaReg(DinoVim):
    """Dino-Mamba's Mamba-Reg: :class:`DinoVim` with registers instead of a cls token.

    ``cls_token`` and ``pos_embed_cls`` are (1, R, C) (R = 12); the registers are spread evenly
    among the patches exactly as the official ``get_cls_idx`` (one after every ``N // (R + 1)``
    patches: positions 15, 31, ..., 191 for 14x14). The 'cls_token' output and
    ``get_intermediate_layers`` return the mean over the registers. This already is the
    official layout; the released Mamba-Reg-B stores a 7x7 ``pos_embed`` (its code defaulted to
    ``img_size=112``): build with ``img_size=112`` to reproduce it at every input size, or with
    224 to have the grid resized once on load (exact at 224).

    Args:
        arch (str | dict): as :class:`DinoVim`. Defaults to 'b'.
        num_registers (int): number of registers R. Defaults to 12.
        **kwargs: see :class:`DinoVim` (``legacy_dinomamba_layout`` does not apply).
    """

    def __init__(self, arch='b', num_registers=12, **kwargs):
        if kwargs.get('legacy_dinomamba_layout'):
            raise ValueError('MambaReg already uses the official Mamba-Reg layout; '
                             'legacy_dinomamba_layout applies to DinoVim only')
        if num_registers < 1:
            raise ValueError(f'num_registers={num_registers} must be >= 1')
        self.num_special = self.num_registers = num_registers
        super().__init__(arch, **kwargs)

    def token_layout(self, hw: tuple[int, int]) -> TokenLayout:
        """Registers spread evenly among the patches, L = N + R."""
        return register_layout(*hw, self.num_registers)

    @property
    def token_layout_name(self) -> str:
        """'registers' (see :class:`DinoVim`)."""
        return REGISTERS
