"""Plain backbones: one trunk, registered presets ViT, LinearViT, DinoVim, MambaReg (+ MILA)."""
from .base import PlainBackbone
from .layout import TokenLayout
from .mila import MILA
from .vim import DinoVim, MambaReg
from .vit import LinearViT, ViT

__all__ = ['PlainBackbone', 'TokenLayout', 'ViT', 'LinearViT', 'DinoVim', 'MambaReg', 'MILA']
