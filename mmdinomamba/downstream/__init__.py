"""Registrations into mmseg / mmdet registries.

Imported only by seg/det configs (``custom_imports=dict(imports=['mmdinomamba',
'mmdinomamba.downstream'])``) so that ``import mmdinomamba`` does not need mmseg or mmdet.

- mmseg ``DATASETS``: :class:`EmbeddedShapesSeg`;
- mmdet ``DATASETS``: :class:`EmbeddedShapesCoco`; mmdet ``MODELS``: :class:`SimpleFPN` (ViTDet
  pyramid for plain backbones) and ``LN2d``;
- mmseg and mmdet ``OPTIM_WRAPPER_CONSTRUCTORS``: :class:`PlainLayerDecayOptimWrapperConstructor`.
"""
from .datasets import EmbeddedShapesCoco, EmbeddedShapesSeg
from .layer_decay import PlainLayerDecayOptimWrapperConstructor, plain_layer_depths
from .simple_fpn import LayerNorm2d, SimpleFPN

__all__ = [
    'EmbeddedShapesCoco', 'EmbeddedShapesSeg', 'LayerNorm2d',
    'PlainLayerDecayOptimWrapperConstructor', 'SimpleFPN', 'plain_layer_depths'
]
