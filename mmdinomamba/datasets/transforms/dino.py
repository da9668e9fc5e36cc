"""DINO's multi-crop augmentation (facebookresearch/dino ``DataAugmentationDINO``).

Built from mmpretrain / mmcv transforms, so it runs on the BGR ``uint8`` arrays of
``LoadImageFromFile``; normalization is left to the data preprocessor.
"""
import warnings
from typing import Sequence, Tuple

from mmcv.transforms import BaseTransform, Compose
from mmpretrain.registry import TRANSFORMS

__all__ = ['DINOMultiCrop']

# mmpretrain's ColorJitter (pillow backend, as torchvision's) calls mmcv.adjust_color, which warns
# on every process that pillow reads only ``alpha`` (the saturation factor we pass): no news.
warnings.filterwarnings('ignore', message="Only use 'alpha' for pillow backend",
                        category=UserWarning)


@TRANSFORMS.register_module()
class DINOMultiCrop(BaseTransform):
    """Two global crops and ``num_local_crops`` local crops of one image.

    Every view: ``RandomResizedCrop`` (bicubic, PIL) -> horizontal flip (p ``flip_prob``) ->
    color jitter (p ``color_jitter_prob``) -> grayscale (p ``grayscale_prob``) -> Gaussian blur
    with a radius drawn per call from ``blur_radius`` -> solarization (threshold 128).
    DINO's per-view probabilities: blur 1.0 / 0.1 on the two global views (the second one also
    solarized with p 0.2), blur 0.5 on every local view. All randomness is drawn per call.

    **Required keys:** ``img``. **Modified keys:** ``img`` becomes the list of views
    ``[global 0, global 1, local 0, ..., local N-1]`` (each (S, S, 3) uint8), ``img_shape``
    (of the first view).

    Args:
        global_crop_size (int): side of the global views. Defaults to 224.
        local_crop_size (int): side of the local views. Defaults to 96.
        global_crops_scale (tuple[float]): area range of the global crops. Defaults to (0.4, 1.).
        local_crops_scale (tuple[float]): area range of the local crops. Defaults to (0.05, 0.4).
        num_local_crops (int): number of local views (>= 0). Defaults to 8.
        global_blur_probs (tuple[float]): blur probability of each global view.
            Defaults to (1.0, 0.1).
        global_solarize_probs (tuple[float]): solarization probability of each global view.
            Defaults to (0.0, 0.2).
        local_blur_prob (float): blur probability of the local views. Defaults to 0.5.
        blur_radius (tuple[float]): uniform range of the blur radius. Defaults to (0.1, 2.0).
        color_jitter (dict): ``ColorJitter`` strengths. Defaults to
            ``dict(brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)``.
        color_jitter_prob (float): Defaults to 0.8.
        grayscale_prob (float): Defaults to 0.2.
        flip_prob (float): Defaults to 0.5.
    """

    def __init__(self, global_crop_size: int = 224, local_crop_size: int = 96,
                 global_crops_scale: Tuple[float, float] = (0.4, 1.),
                 local_crops_scale: Tuple[float, float] = (0.05, 0.4),
                 num_local_crops: int = 8,
                 global_blur_probs: Sequence[float] = (1.0, 0.1),
                 global_solarize_probs: Sequence[float] = (0.0, 0.2),
                 local_blur_prob: float = 0.5, blur_radius: Tuple[float, float] = (0.1, 2.0),
                 color_jitter: dict = None, color_jitter_prob: float = 0.8,
                 grayscale_prob: float = 0.2, flip_prob: float = 0.5):
        if num_local_crops < 0:
            raise ValueError(f'DINOMultiCrop: num_local_crops={num_local_crops} must be >= 0')
        if len(global_blur_probs) != len(global_solarize_probs):
            raise ValueError('DINOMultiCrop: global_blur_probs and global_solarize_probs need '
                             f'one entry per global view, got {len(global_blur_probs)} and '
                             f'{len(global_solarize_probs)}')
        self.num_global_crops, self.num_local_crops = len(global_blur_probs), num_local_crops
        self.global_crop_size, self.local_crop_size = global_crop_size, local_crop_size
        jitter = color_jitter or dict(brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)
        common = [
            dict(type='RandomFlip', prob=flip_prob, direction='horizontal'),
            dict(type='RandomApply', prob=color_jitter_prob,
                 transforms=[TRANSFORMS.build(dict(type='ColorJitter', **jitter))]),
            dict(type='RandomGrayscale', prob=grayscale_prob, keep_channels=True,
                 channel_weights=(0.114, 0.587, 0.2989)),  # BGR luma weights
        ]

        def view(size, scale, blur_p, solarize_p=0.):
            steps = [dict(type='RandomResizedCrop', scale=size, crop_ratio_range=tuple(scale),
                          interpolation='bicubic', backend='pillow'), *common,
                     dict(type='GaussianBlur', magnitude_range=tuple(blur_radius),
                          magnitude_std='inf', prob=blur_p)]
            if solarize_p > 0:
                steps.append(dict(type='Solarize', thr=128, prob=solarize_p))
            return Compose([TRANSFORMS.build(s) for s in steps])

        self.global_views = [view(global_crop_size, global_crops_scale, b, s)
                             for b, s in zip(global_blur_probs, global_solarize_probs)]
        self.local_view = view(local_crop_size, local_crops_scale, local_blur_prob)

    def transform(self, results: dict) -> dict:
        """results['img']: (H, W, 3) uint8 -> list of 2 + N views (see class doc)."""
        img = results['img']
        pipes = self.global_views + [self.local_view] * self.num_local_crops
        views = [pipe(dict(img=img, img_shape=img.shape[:2], ori_shape=img.shape[:2]))['img']
                 for pipe in pipes]
        results['img'] = views
        results['img_shape'] = views[0].shape[:2]
        return results

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(global={self.num_global_crops}x{self.global_crop_size}px, '
                f'local={self.num_local_crops}x{self.local_crop_size}px)')
