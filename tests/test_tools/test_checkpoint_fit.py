"""tools/test.py refuses a checkpoint that does not fit the config (it used to report the metrics
of an effectively random model with a few "missing keys" warnings), and still takes DINO and
backbone-only checkpoints where they fit."""
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmpretrain.registry import MODELS

from mmdinomamba.models.utils import CheckpointMismatchError, load_checkpoint_strict
from repo_files import load_file

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
AUC_VIT = osp.join(REPO, 'configs/analysis/binary-auc_vit-demo_embedded.py')
AUC_VIM = osp.join(REPO, 'configs/analysis/binary-auc_dinovim-demo_embedded.py')
CLS_VIM = osp.join(REPO, 'configs/classification/dinovim-demo_1xb32-5e_embedded-64px.py')


def _dino_checkpoint(path, backbone_cfg):
    """A DINO training checkpoint: student + teacher backbones and heads, the loss center."""
    student, teacher = MODELS.build(backbone_cfg), MODELS.build(backbone_cfg)
    state = {f'backbone.{k}': v for k, v in student.state_dict().items()}
    state.update({f'teacher.backbone.{k}': v for k, v in teacher.state_dict().items()})
    for part in ('head.', 'teacher.head.'):
        state[part + 'mlp.0.weight'] = torch.zeros(8, 4)
        state[part + 'last_layer.weight_g'] = torch.ones(16, 1)
    state['dino_loss.center'] = torch.zeros(1, 16)
    torch.save(dict(state_dict=state, meta=dict(epoch=1)), path)
    return teacher.state_dict()


def _test(config, ckpt, tmp_path, root):
    data = 'test_dataloader.dataset.'
    return load_file('tools/test.py').main([
        config, str(ckpt), '--work-dir', str(tmp_path / 'work'), '--cfg-options',
        f'{data}data_root={root}', 'test_dataloader.batch_size=8'])


def test_checkpoint_of_another_backbone_is_an_error(tmp_path, embedded_root):
    ckpt = tmp_path / 'dino_dinovim.pth'
    _dino_checkpoint(ckpt, Config.fromfile(AUC_VIM).model.backbone.to_dict())
    with pytest.raises(CheckpointMismatchError) as err:
        _test(AUC_VIT, ckpt, tmp_path, embedded_root)
    text = str(err.value)
    assert str(ckpt) in text and text.startswith('FeatMapEvaluator: the weights in')
    assert 'missing keys (' in text and 'backbone.layers.0.mixer.qkv.weight' in text
    assert 'unexpected keys (' in text and 'backbone.layers.0.mixer.in_proj.weight' in text


def test_dino_checkpoint_on_a_classification_config_is_an_error(tmp_path, embedded_root):
    ckpt = tmp_path / 'dino.pth'
    _dino_checkpoint(ckpt, Config.fromfile(CLS_VIM).model.backbone.to_dict())
    with pytest.raises(CheckpointMismatchError) as err:
        _test(CLS_VIM, ckpt, tmp_path, embedded_root)
    text = str(err.value)
    assert str(ckpt) in text and 'missing keys (2): head.fc.weight, head.fc.bias' in text
    assert 'teacher.backbone.' in text and 'DINO pretraining checkpoint' in text


@pytest.mark.parametrize('kind', ['dino', 'backbone-only'])
def test_fitting_checkpoints_load_into_the_evaluator(tmp_path, kind):
    cfg = Config.fromfile(AUC_VIM).model
    path = tmp_path / f'{kind}.pth'
    if kind == 'dino':
        want = _dino_checkpoint(path, cfg.backbone.to_dict())
    else:
        want = MODELS.build(cfg.backbone.to_dict()).state_dict()
        torch.save(dict(state_dict=want), path)
    model = MODELS.build(cfg)
    load_checkpoint_strict(model, str(path))
    for k, v in want.items():  # the teacher, not the student
        assert torch.equal(model.backbone.state_dict()[k], v), k
