"""Models: token mixers, backbones, DINO, heads, necks and classifiers.

The public classes are importable from here, as in mmpretrain
(``from mmdinomamba.models import DinoVim``).
"""
from . import backbones, classifiers, heads, mixers, necks, selfsup  # noqa: F401
from .backbones import MILA, DinoVim, LinearViT, MambaReg, PlainBackbone, TokenLayout, ViT
from .classifiers import LinearProbe
from .heads import DINOHead, DINOLoss
from .mixers import BiSSD, LinearAttention, MambaLikeLinearAttention, SoftmaxAttention
from .necks import ProbeFeatureNeck
from .selfsup import DINO

__all__ = [
    'PlainBackbone', 'TokenLayout', 'ViT', 'LinearViT', 'DinoVim', 'MambaReg', 'MILA', 'DINO',
    'DINOHead', 'DINOLoss', 'LinearProbe', 'ProbeFeatureNeck', 'SoftmaxAttention',
    'LinearAttention', 'BiSSD', 'MambaLikeLinearAttention'
]
