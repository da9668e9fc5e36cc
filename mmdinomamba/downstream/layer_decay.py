"""Layer-wise learning-rate decay for detectors / segmentors with a plain backbone.

mmpretrain's ``LearningRateDecayOptimWrapperConstructor`` asks the *whole model* for
``get_layer_depth``, which mmseg / mmdet models do not have, so it cannot be used there. This
constructor reads the depth of each parameter from the backbone only, and leaves every other
setting of mmengine's ``DefaultOptimWrapperConstructor`` (``custom_keys``, ``bias_decay_mult``,
``norm_decay_mult``, ...) as it is: the lr of a parameter at depth ``d`` is multiplied by
``layer_decay_rate ** (num_layers + 1 - d)``.

Depth (from the names of the backbone contract, ``backbone.layers`` and ``backbone.num_layers``):
0 for the backbone parameters listed before its blocks (patch embedding, position embedding,
cls / register tokens), ``i + 1`` for ``backbone.layers.i.*``, and ``num_layers + 1`` (no decay)
for backbone parameters listed after the blocks (final norm) and for the neck and heads.
"""
import re
from typing import Dict, List

import torch.nn as nn
from mmdet.registry import OPTIM_WRAPPER_CONSTRUCTORS as DET_CONSTRUCTORS
from mmengine.logging import MMLogger
from mmengine.optim import DefaultOptimWrapperConstructor
from mmseg.registry import OPTIM_WRAPPER_CONSTRUCTORS as SEG_CONSTRUCTORS

_LAYER = re.compile(r'^backbone\.layers\.(\d+)\.')


def plain_layer_depths(model: nn.Module) -> Dict[str, int]:
    """Depth (0 .. num_layers + 1) of every parameter name of ``model`` (see module doc)."""
    backbone = getattr(model, 'backbone', None)
    if backbone is None or not hasattr(backbone, 'num_layers'):
        raise TypeError(f'layer-wise lr decay needs model.backbone.num_layers; '
                        f'{type(model).__name__} has no such backbone')
    top = backbone.num_layers + 1
    depths, seen_layers = {}, False
    for name, _ in model.named_parameters():
        if not name.startswith('backbone.'):
            depths[name] = top
        else:
            match = _LAYER.match(name)
            seen_layers = seen_layers or match is not None
            depths[name] = int(match.group(1)) + 1 if match else (top if seen_layers else 0)
    return depths


def _register(cls):
    DET_CONSTRUCTORS.register_module(module=cls)
    SEG_CONSTRUCTORS.register_module(module=cls)
    return cls


@_register
class PlainLayerDecayOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """``DefaultOptimWrapperConstructor`` plus ``paramwise_cfg.layer_decay_rate``.

    Example::

        optim_wrapper = dict(
            constructor='PlainLayerDecayOptimWrapperConstructor',
            optimizer=dict(type='AdamW', lr=1e-4, weight_decay=0.1),
            paramwise_cfg=dict(layer_decay_rate=0.7, bias_decay_mult=0.))

    Args:
        optim_wrapper_cfg (dict): as for ``DefaultOptimWrapperConstructor``.
        paramwise_cfg (dict, optional): as for ``DefaultOptimWrapperConstructor`` plus
            ``layer_decay_rate`` (float in (0, 1], defaults to 1.0 = no decay).
    """

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: dict = None):
        paramwise_cfg = dict(paramwise_cfg or {})
        self.layer_decay_rate = float(paramwise_cfg.pop('layer_decay_rate', 1.0))
        if not 0 < self.layer_decay_rate <= 1:
            raise ValueError(f'paramwise_cfg.layer_decay_rate must be in (0, 1], '
                             f'got {self.layer_decay_rate}')
        paramwise_cfg.setdefault('custom_keys', {})  # non-empty: always build param groups
        super().__init__(optim_wrapper_cfg, paramwise_cfg)

    def add_params(self, params: List[dict], module: nn.Module, prefix: str = '', **kwargs):
        start = len(params)
        super().add_params(params, module, prefix=prefix, **kwargs)
        if prefix == '' and self.layer_decay_rate != 1.0:
            self._decay(params[start:], module)

    def _decay(self, groups: List[dict], model: nn.Module) -> None:
        depths = plain_layer_depths(model)
        names = {id(p): n for n, p in model.named_parameters()}
        top = model.backbone.num_layers + 1
        for group in groups:
            depth = depths[names[id(group['params'][0])]]
            scale = self.layer_decay_rate**(top - depth)
            group['lr'] = group.get('lr', self.base_lr) * scale
            group['lr_scale'] = scale
        MMLogger.get_current_instance().info(
            f'layer-wise lr decay {self.layer_decay_rate} over {top - 1} layers '
            f'(embedding lr x{self.layer_decay_rate**top:.3g})')
