"""DINOMultiCrop: number and sizes of views, DINO's per-view probabilities, fresh randomness."""
import random

import numpy as np
import pytest
import torch
from mmpretrain.registry import MODELS, TRANSFORMS

import mmpretrain.datasets.transforms.auto_augment as auto_augment


def _image(seed=0, size=(48, 40)):
    rng = np.random.RandomState(seed)
    return (rng.rand(*size, 3) * 255).astype(np.uint8)


def _build(**kw):
    cfg = dict(type='DINOMultiCrop', global_crop_size=32, local_crop_size=16, num_local_crops=3)
    cfg.update(kw)
    return TRANSFORMS.build(cfg)


@pytest.mark.parametrize('n_local', [0, 3, 8])
def test_views_count_sizes_and_input_untouched(n_local):
    t = _build(num_local_crops=n_local)
    img = _image()
    before = img.copy()
    out = t(dict(img=img))
    assert len(out['img']) == 2 + n_local
    assert [v.shape for v in out['img']] == [(32, 32, 3)] * 2 + [(16, 16, 3)] * n_local
    assert all(v.dtype == np.uint8 for v in out['img'])
    assert out['img_shape'] == (32, 32)
    np.testing.assert_array_equal(img, before)


def test_fresh_randomness_per_call():
    t = _build()
    np.random.seed(0)
    img = _image()
    a = t(dict(img=img))['img']
    b = t(dict(img=img))['img']
    assert all(not np.array_equal(x, y) for x, y in zip(a, b))
    np.random.seed(5), random.seed(5)
    c = t(dict(img=img))['img']
    np.random.seed(5), random.seed(5)
    d = t(dict(img=img))['img']
    assert all(np.array_equal(x, y) for x, y in zip(c, d))  # seeded -> reproducible


def _steps(pipe):
    return {type(s).__name__: s for s in pipe.transforms}


def test_dino_per_view_probabilities():
    t = _build()
    g0, g1, loc = (_steps(p) for p in (*t.global_views, t.local_view))
    assert g0['GaussianBlur'].prob == 1.0 and 'Solarize' not in g0
    assert g1['GaussianBlur'].prob == 0.1 and g1['Solarize'].prob == 0.2
    assert g1['Solarize'].thr == 128
    assert loc['GaussianBlur'].prob == 0.5 and 'Solarize' not in loc
    for steps, scale in ((g0, (0.4, 1.)), (g1, (0.4, 1.)), (loc, (0.05, 0.4))):
        assert steps['RandomResizedCrop'].crop_ratio_range == scale
        assert steps['RandomResizedCrop'].interpolation == 'bicubic'
        assert steps['RandomFlip'].prob == 0.5
        assert steps['RandomApply'].prob == 0.8
        assert steps['RandomGrayscale'].prob == 0.2


def test_blur_radius_drawn_per_call_in_range(monkeypatch):
    radii = []
    real = auto_augment.ImageFilter.GaussianBlur

    def spy(radius):
        radii.append(radius)
        return real(radius=radius)

    monkeypatch.setattr(auto_augment.ImageFilter, 'GaussianBlur', spy)
    t = _build(num_local_crops=0)
    np.random.seed(1)
    for _ in range(20):
        t(dict(img=_image()))
    # the first global view is always blurred: >= 20 radii, all distinct, in [0.1, 2.0]
    assert len(radii) >= 20 and len(set(radii)) == len(radii)
    assert min(radii) >= 0.1 and max(radii) <= 2.0


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match='num_local_crops=-1'):
        _build(num_local_crops=-1)
    with pytest.raises(ValueError, match='one entry per global view'):
        _build(global_blur_probs=(1.0, 0.1), global_solarize_probs=(0.0, ))


def test_packs_into_multi_resolution_batches():
    pipeline = [_build(num_local_crops=2), TRANSFORMS.build(dict(type='PackInputs'))]
    samples = []
    for i in range(3):
        data = dict(img=_image(i))
        for p in pipeline:
            data = p(data)
        samples.append(data)
    from mmengine.dataset import default_collate
    batch = default_collate(samples)
    pre = MODELS.build(dict(type='SelfSupDataPreprocessor', mean=[123.675, 116.28, 103.53],
                            std=[58.395, 57.12, 57.375], to_rgb=True))
    inputs = pre(batch, training=True)['inputs']
    assert [tuple(x.shape) for x in inputs] == [(3, 3, 32, 32)] * 2 + [(3, 3, 16, 16)] * 2
    assert all(x.dtype == torch.float32 for x in inputs)
