"""ViTDet's simple feature pyramid for plain (single-scale) backbones, in mmdet's registry.

Li et al., "Exploring Plain Vision Transformer Backbones for Object Detection" (ViTDet),
https://arxiv.org/abs/2203.16527. A plain backbone gives one stride-16 map; the pyramid is built
from it alone: x4 by two stride-2 transposed convolutions, x2 by one, x1 as is, x0.5 by max
pooling; each level then gets a 1x1 lateral and a 3x3 output convolution (both normed), and extra
levels come from stride-2 subsampling of the coarsest one (``LastLevelMaxPool``).
"""
from typing import Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import ConvModule, build_activation_layer, build_norm_layer
from mmdet.registry import MODELS
from mmengine.model import BaseModule
from torch import Tensor

_SUPPORTED_SCALES = (4.0, 2.0, 1.0, 0.5)


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of a (B, C, H, W) map (each pixel normed on its own).

    Args:
        num_channels (int): C.
        eps (float): added to the variance. Defaults to 1e-6.
    """

    def __init__(self, num_channels: int, eps: float = 1e-6, **kwargs):
        super().__init__(num_channels, eps=eps, **kwargs)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, C, H, W) -> (B, C, H, W)."""
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


if 'LN2d' not in MODELS.module_dict:  # mmdet does not ship one; mmpretrain's is in its own scope
    MODELS.register_module('LN2d', module=LayerNorm2d)


def _resolve_norm(norm_cfg: dict) -> dict:
    """``type='LN2d'`` -> the class itself, so the neck builds outside the mmdet scope too
    (mmcv's ``build_norm_layer`` looks names up in the current default scope only)."""
    if norm_cfg is not None and norm_cfg.get('type') in ('LN2d', 'mmdet.LN2d'):
        return dict(norm_cfg, type=LayerNorm2d)
    return norm_cfg


def _rescale_block(scale: float, channels: int, norm_cfg: dict, act_cfg: dict) -> nn.Module:
    """(B, C, H, W) -> (B, C', H * scale, W * scale) with C' = C/4, C/2, C, C for scale 4..0.5."""
    if scale == 4.0:
        return nn.Sequential(
            nn.ConvTranspose2d(channels, channels // 2, 2, stride=2),
            build_norm_layer(norm_cfg, channels // 2)[1], build_activation_layer(act_cfg),
            nn.ConvTranspose2d(channels // 2, channels // 4, 2, stride=2))
    if scale == 2.0:
        return nn.ConvTranspose2d(channels, channels // 2, 2, stride=2)
    if scale == 1.0:
        return nn.Identity()
    return nn.MaxPool2d(kernel_size=2, stride=2)


@MODELS.register_module()
class SimpleFPN(BaseModule):
    """ViTDet simple feature pyramid: one stride-16 map -> ``num_outs`` maps of ``out_channels``.

    With the defaults the outputs have strides 4, 8, 16, 32 and 64 (relative to the image) for a
    stride-16 input, as mmdet's ``FPN`` gives for a ResNet, so RPN / RoI heads are unchanged.

    Args:
        in_channels (int): channels C of the backbone map (must be divisible by 4).
        out_channels (int): channels of every output level.
        scale_factors (Sequence[float]): resampling of each pyramid level, a subset of
            (4, 2, 1, 0.5) in decreasing order. Defaults to (4.0, 2.0, 1.0, 0.5).
        num_outs (int): number of outputs; levels beyond ``len(scale_factors)`` are stride-2
            subsamplings of the last one. Defaults to 5.
        in_index (int): which backbone output to use when the input is a tuple/list.
            Defaults to -1.
        norm_cfg (dict): norm after the first deconvolution and in the lateral/output
            convolutions. Defaults to ``dict(type='LN2d')`` (channel LayerNorm).
        act_cfg (dict): activation between the two x4 deconvolutions.
            Defaults to ``dict(type='GELU')``.
        init_cfg (dict, optional): mmengine init config. Defaults to None.
    """

    def __init__(self, in_channels: int, out_channels: int,
                 scale_factors: Sequence[float] = _SUPPORTED_SCALES, num_outs: int = 5,
                 in_index: int = -1, norm_cfg: dict = dict(type='LN2d'),
                 act_cfg: dict = dict(type='GELU'), init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        scale_factors = tuple(float(s) for s in scale_factors)
        bad = [s for s in scale_factors if s not in _SUPPORTED_SCALES]
        if bad or list(scale_factors) != sorted(scale_factors, reverse=True):
            raise ValueError(f'SimpleFPN: scale_factors must be a decreasing subset of '
                             f'{_SUPPORTED_SCALES}, got {scale_factors}')
        if in_channels % 4:
            raise ValueError(f'SimpleFPN: in_channels must be divisible by 4, got {in_channels}')
        if num_outs < len(scale_factors):
            raise ValueError(f'SimpleFPN: num_outs ({num_outs}) must be >= len(scale_factors) '
                             f'({len(scale_factors)})')
        self.in_channels, self.out_channels = in_channels, out_channels
        self.scale_factors, self.num_outs, self.in_index = scale_factors, num_outs, in_index
        norm_cfg = _resolve_norm(norm_cfg)
        level_channels = {4.0: in_channels // 4, 2.0: in_channels // 2, 1.0: in_channels,
                          0.5: in_channels}
        self.rescales = nn.ModuleList(
            _rescale_block(s, in_channels, norm_cfg, act_cfg) for s in scale_factors)
        self.lateral_convs = nn.ModuleList(
            ConvModule(level_channels[s], out_channels, 1, norm_cfg=norm_cfg, act_cfg=None)
            for s in scale_factors)
        self.fpn_convs = nn.ModuleList(
            ConvModule(out_channels, out_channels, 3, padding=1, norm_cfg=norm_cfg, act_cfg=None)
            for _ in scale_factors)

    def forward(self, inputs: Union[Tensor, Sequence[Tensor]]) -> Tuple[Tensor, ...]:
        """inputs: (B, C, H, W) or a tuple of such maps (``in_index`` picks one).

        Returns:
            tuple[Tensor]: ``num_outs`` maps (B, out_channels, H * s, W * s) for each scale s,
            then the extra levels, each half the size of the previous one (rounded up).
        """
        x = inputs if isinstance(inputs, torch.Tensor) else inputs[self.in_index]
        outs = [fpn(lat(rescale(x))) for rescale, lat, fpn in zip(
            self.rescales, self.lateral_convs, self.fpn_convs)]
        while len(outs) < self.num_outs:
            outs.append(F.max_pool2d(outs[-1], kernel_size=1, stride=2))
        return tuple(outs)
