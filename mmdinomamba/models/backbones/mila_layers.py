"""Layers of the hierarchical MILA backbone: stems, downsampling and the block.

Structure after LeapLabTHU/MLLA (``models/mlla.py``; facts, own code): a convolutional stem of
stride 4, MBConv-style patch merging, and blocks ``x += CPE(x); x += DropPath(mixer(LN(x)));
x += CPE(x); x += DropPath(MLP(LN(x)))``. The Swin-style alternatives (4x4 patch stem, 2x2
concatenating merge) build the ablation baselines of the paper (Swin-T geometry).

All modules take and return tokens ``(B, L, C)`` in raster order with their grid ``hw``; odd grids
are handled (stride-2 convolutions with padding 1 give ``ceil(H / 2)``; the Swin layers pad).
"""
from typing import Tuple

import torch.nn.functional as F
from mmpretrain.registry import MODELS
from torch import Tensor, nn

from ..utils import DropPath, Mlp

__all__ = ['ConvBN', 'ConvStem', 'PatchStem', 'MBConvMerging', 'LinearMerging', 'MILABlock']

HW = Tuple[int, int]


def _to_img(x: Tensor, hw: HW) -> Tensor:
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], *hw)


def _to_tokens(x: Tensor) -> Tuple[Tensor, HW]:
    return x.flatten(2).transpose(1, 2), (x.shape[-2], x.shape[-1])


class ConvBN(nn.Sequential):
    """``Conv2d -> [BatchNorm2d] -> [ReLU]`` with 'same' padding for odd kernels.

    Args:
        in_ch, out_ch (int): channels. kernel (int), stride (int), groups (int): conv settings.
        bias (bool): conv bias. norm (bool): add BatchNorm. act (bool): add ReLU.
    """

    def __init__(self, in_ch: int, out_ch: int, kernel: int = 3, stride: int = 1,
                 groups: int = 1, bias: bool = True, norm: bool = True, act: bool = True):
        super().__init__()
        self.conv = nn.Conv2d(in_ch, out_ch, kernel, stride, kernel // 2, groups=groups, bias=bias)
        if norm:
            self.norm = nn.BatchNorm2d(out_ch)
        if act:
            self.act = nn.ReLU()


class ConvStem(nn.Module):
    """MILA stem, stride 4: ``3x3 s2 (C/2) -> + two 3x3 (residual) -> 3x3 s2 (4C) -> 1x1 (C)``.

    Args:
        in_channels (int): image channels. embed_dims (int): output width ``C``.
    """

    def __init__(self, in_channels: int, embed_dims: int):
        super().__init__()
        half = embed_dims // 2
        self.conv1 = ConvBN(in_channels, half, 3, 2, bias=False)
        self.conv2 = nn.Sequential(ConvBN(half, half, 3, bias=False),
                                   ConvBN(half, half, 3, bias=False, act=False))
        self.conv3 = nn.Sequential(ConvBN(half, 4 * embed_dims, 3, 2, bias=False),
                                   ConvBN(4 * embed_dims, embed_dims, 1, bias=False, act=False))

    def forward(self, x: Tensor) -> Tuple[Tensor, HW]:
        """x: (B, in_channels, H, W) -> tokens (B, ceil(H/4) * ceil(W/4), C) and the grid."""
        x = self.conv1(x)
        return _to_tokens(self.conv3(self.conv2(x) + x))


class PatchStem(nn.Module):
    """Swin stem: ``Conv2d(kernel=stride=4)`` (input padded to a multiple of 4) -> LayerNorm."""

    def __init__(self, in_channels: int, embed_dims: int, patch_size: int = 4):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_channels, embed_dims, patch_size, patch_size)
        self.norm = nn.LayerNorm(embed_dims)

    def forward(self, x: Tensor) -> Tuple[Tensor, HW]:
        p = self.patch_size
        x = F.pad(x, (0, -x.shape[-1] % p, 0, -x.shape[-2] % p))
        tokens, hw = _to_tokens(self.proj(x))
        return self.norm(tokens), hw


class MBConvMerging(nn.Module):
    """MILA downsampling: ``1x1 (ratio * C_out, ReLU) -> dw 3x3 s2 (ReLU) -> 1x1 (C_out, BN)``.

    Args:
        in_dims (int): input width. out_dims (int): output width. ratio (float): expansion of
            ``out_dims`` in the hidden layers. Defaults to 4.
    """

    def __init__(self, in_dims: int, out_dims: int, ratio: float = 4.):
        super().__init__()
        hidden = int(out_dims * ratio)
        self.conv = nn.Sequential(
            ConvBN(in_dims, hidden, 1, norm=False),
            ConvBN(hidden, hidden, 3, 2, groups=hidden, norm=False),
            ConvBN(hidden, out_dims, 1, act=False))

    def forward(self, x: Tensor, hw: HW) -> Tuple[Tensor, HW]:
        """x: (B, H*W, C_in) -> (B, ceil(H/2) * ceil(W/2), C_out) and the new grid."""
        return _to_tokens(self.conv(_to_img(x, hw)))


class LinearMerging(nn.Module):
    """Swin patch merging: 2x2 neighbours concatenated (odd grids padded) -> LN -> Linear."""

    def __init__(self, in_dims: int, out_dims: int):
        super().__init__()
        self.norm = nn.LayerNorm(4 * in_dims)
        self.reduction = nn.Linear(4 * in_dims, out_dims, bias=False)

    def forward(self, x: Tensor, hw: HW) -> Tuple[Tensor, HW]:
        img = _to_img(x, hw)
        img = F.pad(img, (0, hw[1] % 2, 0, hw[0] % 2))
        img = F.pixel_unshuffle(img, 2)  # (B, 4C, H/2, W/2)
        tokens, new_hw = _to_tokens(img)
        return self.reduction(self.norm(tokens)), new_hw


class MILABlock(nn.Module):
    """``[CPE] -> x + mixer(LN(x)) -> [CPE] -> x + MLP(LN(x))`` with drop path.

    Args:
        embed_dims (int): width ``C``.
        mixer_cfg (dict): config of the token mixer (``embed_dims`` is filled in), e.g.
            ``dict(type='MambaLikeLinearAttention', num_heads=2, ...)``.
        mlp_ratio (float): MLP hidden ratio. Defaults to 4.
        drop_path (float): stochastic depth. Defaults to 0.
        cpe (bool): conditional position encoding (depthwise 3x3 residual) before the mixer and
            before the MLP. Defaults to True.
    """

    def __init__(self, embed_dims: int, mixer_cfg: dict, mlp_ratio: float = 4.,
                 drop_path: float = 0., cpe: bool = True):
        super().__init__()
        c = embed_dims
        self.cpe1 = nn.Conv2d(c, c, 3, padding=1, groups=c) if cpe else None
        self.norm1 = nn.LayerNorm(c)
        self.mixer = MODELS.build(dict(mixer_cfg, embed_dims=c))
        self.cpe2 = nn.Conv2d(c, c, 3, padding=1, groups=c) if cpe else None
        self.norm2 = nn.LayerNorm(c)
        self.mlp = Mlp(c, int(c * mlp_ratio))
        self.drop_path = DropPath(drop_path)

    @staticmethod
    def _cpe(conv, x: Tensor, hw: HW) -> Tensor:
        return x if conv is None else x + _to_tokens(conv(_to_img(x, hw)))[0]

    def forward_with_mixer(self, x: Tensor, hw: HW) -> Tuple[Tensor, Tensor]:
        """x: (B, H*W, C) -> (block output, mixer output), both (B, H*W, C)."""
        x = self._cpe(self.cpe1, x, hw)
        y = self.mixer(self.norm1(x), hw)
        x = x + self.drop_path(y)
        x = self._cpe(self.cpe2, x, hw)
        return x + self.drop_path(self.mlp(self.norm2(x))), y

    def forward(self, x: Tensor, hw: HW) -> Tensor:
        """x: (B, H*W, C) -> (B, H*W, C)."""
        return self.forward_with_mixer(x, hw)[0]

    def mixer_input(self, x: Tensor, hw: HW) -> Tensor:
        """The mixer's input ``norm1(cpe1(x))`` for ``mixing_matrix`` (CPE comes first)."""
        return self.norm1(self._cpe(self.cpe1, x, hw))
