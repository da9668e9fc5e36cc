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
