"""Parameter counts of the presets (backbone only), built on the meta device (no memory)."""
import pytest
import torch

import mmdinomamba  # noqa: F401
from mmdinomamba.models.backbones import DinoVim, LinearViT, MambaReg, ViT
from mmdinomamba.models.utils import build_on_meta


def count(cls, arch):
    model = build_on_meta(lambda: cls(arch=arch))
    return sum(p.numel() for p in model.parameters())


def vit_formula(C, depth=12, patches=196):
    """DINO ViT/16: patch conv + (N + 1) pos + cls + per-layer (qkv, proj, MLP x4, 2 LN) + LN."""
    return 3 * 256 * C + C + (patches + 1) * C + C + depth * (12 * C * C + 13 * C) + 2 * C


@pytest.mark.parametrize('cls,arch,paper', [(ViT, 's', 21e6), (ViT, 'b', 85e6),
                                            (LinearViT, 'b', 85e6)])
def test_vit_counts(cls, arch, paper):
    n = count(cls, arch)
    assert n == vit_formula(384 if arch == 's' else 768)  # 21,665,664 / 85,798,656
    assert abs(n - paper) / paper < 0.035


@pytest.mark.parametrize('arch,paper,anchor', [('t', 10.7e6, 10.71e6), ('s', 40.4e6, 40.35e6),
                                               ('b', 89.0e6, 88.97e6)])
def test_dinovim_counts(arch, paper, anchor):
    n = count(DinoVim, arch)
    assert abs(n - paper) / paper < 0.02
    assert abs(n - anchor) / anchor < 0.002  # the official Dino-Mamba shapes


def test_mambareg_count():
    n_reg, n_vim = count(MambaReg, 'b'), count(DinoVim, 'b')
    assert n_reg - n_vim == 2 * 11 * 768  # 12 register tokens + 12 positions instead of 1 + 1
    assert torch.device('meta') == build_on_meta(lambda: DinoVim(arch='t')).pos_embed.device
