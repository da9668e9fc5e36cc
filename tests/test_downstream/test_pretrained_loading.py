"""The backbone of a seg / det model loads a DINO checkpoint's teacher backbone (or an
extracted backbone) with no missing key; a pos-embed of another grid is resized on load."""
import pytest
import torch
from mmengine.registry import init_default_scope

from mmdinomamba.models.utils import resize_pos_embed


def _write_checkpoint(path, backbone_cfg, registry, extracted):
    torch.manual_seed(1)
    teacher = registry.build(backbone_cfg)
    student = registry.build(backbone_cfg)
    state = {f'backbone.{k}': v for k, v in teacher.state_dict().items()}
    if not extracted:  # a DINO checkpoint: student + teacher + heads
        state = {f'teacher.{k}': v for k, v in state.items()}
        state.update({f'backbone.{k}': v for k, v in student.state_dict().items()})
        state['head.last_layer.weight_g'] = torch.ones(3, 1)
    torch.save(dict(state_dict=state, meta=dict()), path)
    return teacher.state_dict()


@pytest.mark.parametrize('task, extracted', [('seg', False), ('det', True)])
def test_backbone_weights_load(task, extracted, seg_cfg, det_cfg, tmp_path):
    cfg = seg_cfg if task == 'seg' else det_cfg
    init_default_scope('mmseg' if task == 'seg' else 'mmdet')
    registry = __import__(f'mm{task}.registry', fromlist=['MODELS']).MODELS
    path = str(tmp_path / 'dino.pth')
    src = dict(cfg.model.backbone, init_cfg=None, img_size=64)  # pretrained on a 4x4 grid
    reference = _write_checkpoint(path, src, registry, extracted)
    cfg.model.backbone.init_cfg = dict(type='Pretrained', checkpoint=path,
                                       prefix='backbone.' if extracted else 'teacher.backbone.')
    model = registry.build(cfg.model)
    model.init_weights()
    own = model.backbone.state_dict()
    assert set(own) == set(reference)  # no missing and no unexpected backbone keys
    for key, value in reference.items():
        if key == 'pos_embed':  # 4x4 grid of the checkpoint -> the model's 8x8 grid
            assert own[key].shape == (1, 64, value.shape[-1])
            torch.testing.assert_close(own[key], resize_pos_embed(value, (4, 4), (8, 8)))
        else:
            torch.testing.assert_close(own[key], value, msg=key)


def _seg_model(cfg, path, prefix):
    init_default_scope('mmseg')
    registry = __import__('mmseg.registry', fromlist=['MODELS']).MODELS
    cfg.model.backbone.init_cfg = dict(type='Pretrained', checkpoint=path, prefix=prefix)
    return registry.build(cfg.model)


def test_mismatched_pretrained_backbone_is_an_error(seg_cfg, tmp_path):
    """A checkpoint of another patch size (and a wrong prefix) used to load with one warning
    and train on random weights; now ``init_weights`` stops, naming the file, prefix and keys."""
    from mmdinomamba.models.utils import CheckpointMismatchError
    registry = __import__('mmseg.registry', fromlist=['MODELS']).MODELS
    init_default_scope('mmseg')
    path = str(tmp_path / 'dino_p8.pth')
    _write_checkpoint(path, dict(seg_cfg.model.backbone, init_cfg=None, patch_size=8), registry,
                      extracted=False)
    model = _seg_model(seg_cfg, path, 'teacher.backbone.')
    with pytest.raises(CheckpointMismatchError) as err:
        model.init_weights()
    text = str(err.value)
    assert path in text and "(prefix 'teacher.backbone.')" in text
    assert 'size mismatch for patch_embed.proj.weight' in text
    with pytest.raises(KeyError, match=r"dino_p8\.pth has no keys under the prefix "
                       r"'student\.backbone\.'.*\['backbone', 'head', 'teacher'\]"):
        _seg_model(seg_cfg, path, 'student.backbone.').init_weights()


def test_extracted_backbone_loads_whatever_the_prefix(seg_cfg, tmp_path):
    registry = __import__('mmseg.registry', fromlist=['MODELS']).MODELS
    init_default_scope('mmseg')
    src = registry.build(dict(seg_cfg.model.backbone, init_cfg=None))
    path = str(tmp_path / 'bare.pth')
    torch.save(dict(state_dict=src.state_dict()), path)
    for prefix in (None, '', 'backbone.', 'teacher.backbone.'):
        model = _seg_model(seg_cfg, path, prefix)
        model.init_weights()
        for k, v in src.state_dict().items():
            assert torch.equal(model.backbone.state_dict()[k], v), (prefix, k)


MILA_TINY = dict(type='mmpretrain.MILA', arch=dict(embed_dims=16, depths=[1, 1, 1, 1],
                                                  num_heads=[1, 2, 2, 4]))


def test_mila_classifier_weights_in_a_multi_stage_backbone(tmp_path):
    """A MILA classifier checkpoint (norm3 only) loads into a 4-output backbone: the extra stage
    norms are the one documented exception; any other missing key is an error."""
    from mmpretrain.registry import MODELS

    from mmdinomamba.models.utils import CheckpointMismatchError
    cls = MODELS.build(dict(type='ImageClassifier', backbone=dict(MILA_TINY, type='MILA'),
                            neck=dict(type='GlobalAveragePooling'),
                            head=dict(type='LinearClsHead', num_classes=3, in_channels=128)))
    path = str(tmp_path / 'mila_cls.pth')
    torch.save(dict(state_dict=cls.state_dict()), path)
    init = dict(type='Pretrained', checkpoint=path, prefix='backbone.')
    seg = MODELS.build(dict(MILA_TINY, type='MILA', out_indices=(0, 1, 2, 3),
                            out_type='featmap', init_cfg=init))
    seg.init_weights()
    for k, v in cls.backbone.state_dict().items():
        assert torch.equal(seg.state_dict()[k], v), k
    assert torch.equal(seg.norm0.weight, torch.ones(16))
    broken = {k: v for k, v in cls.state_dict().items() if 'layers.2.mlp' not in k}
    torch.save(dict(state_dict=broken), path)
    seg = MODELS.build(dict(MILA_TINY, type='MILA', out_indices=(0, 1, 2, 3), init_cfg=init))
    with pytest.raises(CheckpointMismatchError, match=r'missing keys \(4\): layers\.2\.mlp'):
        seg.init_weights()
