"""ViT and LinearViT presets of the plain trunk (cls token at the front)."""
from mmpretrain.registry import MODELS
from torch import nn

from ..mixers import LinearAttention, SoftmaxAttention
from ..utils import Mlp
from .base import PlainBackbone
from .blocks import Block
from .layout import TokenLayout, front_cls_layout

__all__ = ['ViT', 'LinearViT']

_VIT_ZOO = {
    **dict.fromkeys(['s', 'small'], dict(embed_dims=384, num_layers=12, num_heads=6)),
    **dict.fromkeys(['b', 'base'], dict(embed_dims=768, num_layers=12, num_heads=12)),
}


@MODELS.register_module()
class ViT(PlainBackbone):
    """DINO's Vision Transformer (Dosovitskiy et al. 2021; Caron et al. 2021) on the plain trunk.

    Pre-norm blocks ``norm1 -> SoftmaxAttention -> norm2 -> Mlp(GELU)`` with LayerNorm
    (eps 1e-6), MLP ratio 4, qkv bias; sequence ``[cls, patches]`` (``cls_token`` plus its own
    ``pos_embed_cls``; ``pos_embed`` holds the patch grid). Official DINO ViT-S/16 and B/16
    checkpoints convert with ``tools/model_converters/dino_vit2mmdm.py`` and compute the same
    outputs at any input size.

    Archs: ``'s'`` 384 wide / 12 layers / 6 heads (~21.7M), ``'b'`` 768 / 12 / 12 (~85.8M).
    A dict arch needs ``embed_dims, num_layers, num_heads`` (optional ``mlp_ratio``, default 4).

    Args:
        arch (str | dict): see above. Defaults to 'b'.
        qkv_bias (bool): bias of the qkv projection. Defaults to True.
        drop_rate (float): dropout after the attention/MLP projections. Defaults to 0.
        attn_drop_rate (float): attention-weight dropout. Defaults to 0.
        **kwargs: trunk options of :class:`PlainBackbone` (img_size, patch_size, out_indices,
            out_type, drop_path_rate, final_norm, frozen_stages, norm_eval, with_cp, init_cfg).
    """
    arch_zoo = _VIT_ZOO
    arch_keys = ('embed_dims', 'num_layers', 'num_heads')
    arch_defaults = dict(mlp_ratio=4.)

    def __init__(self, arch='b', qkv_bias=True, drop_rate=0., attn_drop_rate=0., **kwargs):
        self.qkv_bias, self.drop_rate, self.attn_drop_rate = qkv_bias, drop_rate, attn_drop_rate
        super().__init__(arch, **kwargs)

    def _build_mixer(self) -> nn.Module:
        return SoftmaxAttention(self.embed_dims, self.arch_settings['num_heads'],
                                qkv_bias=self.qkv_bias, attn_drop=self.attn_drop_rate,
                                proj_drop=self.drop_rate)

    def _build_norm(self) -> nn.Module:
        return nn.LayerNorm(self.embed_dims, eps=1e-6)

    def _build_block(self, index: int, drop_path: float) -> nn.Module:
        hidden = int(self.embed_dims * self.arch_settings['mlp_ratio'])
        return Block(self._build_norm(), self._build_mixer(), drop_path,
                     norm2=self._build_norm(), mlp=Mlp(self.embed_dims, hidden, self.drop_rate))

    def _init_params(self) -> None:
        super()._init_params()
        for m in self.layers.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def token_layout(self, hw: tuple[int, int]) -> TokenLayout:
        """``[cls, patches]``: cls at 0, L = h*w + 1."""
        return front_cls_layout(*hw)


@MODELS.register_module()
class LinearViT(ViT):
    """The paper's LinearViT: :class:`ViT` with ``softmax(QK^T)`` replaced by ``psi(Q) psi(K)^T``.

    Same archs and parameters as :class:`ViT` (``'b'`` ~85.8M); the mixer is
    :class:`LinearAttention` (``kernel='softmax'``: psi(Q) row-softmax over features, psi(K)
    softmax over tokens; ``'elu'`` = ELU + 1 with row normalization).

    Args:
        kernel (str): feature map of :class:`LinearAttention`. Defaults to 'softmax'.
        **kwargs: see :class:`ViT`.
    """

    def __init__(self, arch='b', kernel='softmax', **kwargs):
        self.kernel = kernel
        super().__init__(arch, **kwargs)

    def _build_mixer(self) -> nn.Module:
        return LinearAttention(self.embed_dims, self.arch_settings['num_heads'],
                               kernel=self.kernel, qkv_bias=self.qkv_bias,
                               proj_drop=self.drop_rate)
