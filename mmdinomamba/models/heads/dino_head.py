"""DINO projection head: MLP -> L2 normalization -> weight-normed linear layer.

Caron et al., "Emerging Properties in Self-Supervised Vision Transformers", ICCV 2021
(https://arxiv.org/abs/2104.14294), Section 3.1 and the official ``DINOHead``.
"""
import math

import torch
import torch.nn.functional as F
from mmengine.model import BaseModule
from mmpretrain.registry import MODELS
from torch import Tensor, nn

__all__ = ['DINOHead', 'WeightNormLinear']


class WeightNormLinear(nn.Module):
    """Bias-free linear layer with weight normalization, ``W = g * v / ||v||`` (row-wise).

    Same parametrization as ``torch.nn.utils.weight_norm(nn.Linear(...), dim=0)``: ``weight_v``
    (out, in) and ``weight_g`` (out, 1). DINO fills ``g`` with 1 and, with ``norm_last_layer``,
    freezes it (``requires_grad=False``), so every output row of ``W`` has unit norm.

    Args:
        in_features (int): input width.
        out_features (int): output width.
        learn_norm (bool): train ``weight_g``. Defaults to False.
    """

    def __init__(self, in_features: int, out_features: int, learn_norm: bool = False):
        super().__init__()
        self.weight_v = nn.Parameter(torch.empty(out_features, in_features))
        nn.init.kaiming_uniform_(self.weight_v, a=math.sqrt(5))  # nn.Linear's default init
        self.weight_g = nn.Parameter(torch.ones(out_features, 1), requires_grad=learn_norm)

    @property
    def weight(self) -> Tensor:
        """The effective weight (out, in)."""
        return self.weight_v * (self.weight_g / self.weight_v.norm(dim=1, keepdim=True))

    def forward(self, x: Tensor, detach_weight: bool = False) -> Tensor:
        """x: (..., in) -> (..., out). ``detach_weight`` stops gradients to ``v`` and ``g``."""
        weight = self.weight
        return F.linear(x, weight.detach() if detach_weight else weight)


@MODELS.register_module()
class DINOHead(BaseModule):
    """DINO projection head.

    ``num_layers`` linear layers (``in -> hidden -> ... -> bottleneck``, GELU between them, optional
    BatchNorm), L2 normalization of the bottleneck feature, then a bias-free weight-normed linear
    layer to ``out_channels`` (the "prototypes"). Linear layers are initialized with a truncated
    normal (std 0.02) and zero bias, as in DINO.

    Args:
        in_channels (int): backbone feature width.
        out_channels (int): output dimension K. Defaults to 65536.
        hidden_channels (int): MLP hidden width. Defaults to 2048.
        bottleneck_channels (int): width before the last layer. Defaults to 256.
        num_layers (int): MLP layers (>= 1). Defaults to 3.
        use_bn (bool): BatchNorm after each hidden linear layer. Defaults to False.
        norm_last_layer (bool): freeze ``last_layer.weight_g`` at 1 (unit-norm prototypes).
            Defaults to True.
        init_cfg (dict, optional): mmengine init config. Defaults to None.

    Shapes:
        forward: x (N, in_channels) -> (N, out_channels)
    """

    def __init__(self, in_channels: int, out_channels: int = 65536, hidden_channels: int = 2048,
                 bottleneck_channels: int = 256, num_layers: int = 3, use_bn: bool = False,
                 norm_last_layer: bool = True, init_cfg=None):
        super().__init__(init_cfg)
        if num_layers < 1:
            raise ValueError(f'DINOHead: num_layers={num_layers} must be >= 1')
        self.in_channels, self.out_channels = in_channels, out_channels
        self.norm_last_layer = norm_last_layer
        widths = [in_channels] + [hidden_channels] * (num_layers - 1) + [bottleneck_channels]
        layers = []
        for i in range(num_layers):
            layers.append(nn.Linear(widths[i], widths[i + 1]))
            if i < num_layers - 1:
                if use_bn:
                    layers.append(nn.BatchNorm1d(widths[i + 1]))
                layers.append(nn.GELU())
        self.mlp = nn.Sequential(*layers)
        for m in self.mlp.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=.02)
                nn.init.zeros_(m.bias)
        self.last_layer = WeightNormLinear(bottleneck_channels, out_channels,
                                           learn_norm=not norm_last_layer)

    def forward(self, x: Tensor, detach_last_layer: bool = False) -> Tensor:
        """x: (N, in_channels) -> logits (N, out_channels).

        ``detach_last_layer`` (DINO's frozen last layer during the first epoch): the last layer
        is applied but receives no gradient, so its ``.grad`` stays None and the optimizer
        leaves it (and its optimizer state) untouched.
        """
        x = F.normalize(self.mlp(x), dim=-1, p=2)
        return self.last_layer(x, detach_weight=detach_last_layer)
