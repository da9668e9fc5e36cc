"""Registrations into mmseg / mmdet registries.

Imported only by seg/det configs (``custom_imports=dict(imports=['mmdinomamba',
'mmdinomamba.downstream'])``) so that ``import mmdinomamba`` does not need mmseg or mmdet.

- mmseg ``DATASETS``: :class:`EmbeddedShapesSeg`;
- mmdet ``DATASETS``: :class:`EmbeddedShapesCoco`; mmdet ``MODELS``: :class:`SimpleFPN` (ViTDet
  pyramid for plain backbones) and ``LN2d``;
- mmseg and mmdet ``OPTIM_WRAPPER_CONSTRUCTORS``: :class:`PlainLayerDecayOptimWrapperConstructor`;
- mmseg and mmdet ``TRANSFORMS``: ``LoadImageFromFile`` whose errors name the file
  (:class:`mmdinomamba.datasets.transforms.LoadImageFromFile`).
"""
from mmdinomamba.utils.quiet import without_onedl_notice

with without_onedl_notice():
    from mmdet.registry import TRANSFORMS as _DET_TRANSFORMS
    from mmseg.registry import TRANSFORMS as _SEG_TRANSFORMS

    from mmdinomamba.datasets.transforms import LoadImageFromFile as _LoadImageFromFile
    from .datasets import EmbeddedShapesCoco, EmbeddedShapesSeg
    from .layer_decay import PlainLayerDecayOptimWrapperConstructor, plain_layer_depths
    from .simple_fpn import LayerNorm2d, SimpleFPN

for _registry in (_SEG_TRANSFORMS, _DET_TRANSFORMS):
    _registry.register_module(name='LoadImageFromFile', module=_LoadImageFromFile, force=True)

__all__ = [
    'EmbeddedShapesCoco', 'EmbeddedShapesSeg', 'LayerNorm2d',
    'PlainLayerDecayOptimWrapperConstructor', 'SimpleFPN', 'plain_layer_depths'
]
