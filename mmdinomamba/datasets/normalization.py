"""The ImageNet normalization of every model here (RGB channel order, pixel values 0-255).

Configs hold the same numbers (mmengine configs cannot import them); code takes them from here.
"""
IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)

__all__ = ['IMAGENET_MEAN', 'IMAGENET_STD', 'imagenet_preprocessor']


def imagenet_preprocessor(type: str = 'ClsDataPreprocessor', **kwargs) -> dict:
    """Config of an mmpretrain data preprocessor that converts BGR to RGB and normalizes with
    the ImageNet mean / std (``kwargs`` are added, e.g. ``num_classes``)."""
    return dict(type=type, mean=list(IMAGENET_MEAN), std=list(IMAGENET_STD), to_rgb=True,
                **kwargs)
