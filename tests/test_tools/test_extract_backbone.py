"""tools/model_converters/extract_backbone.py: a DINO checkpoint's teacher / student backbone."""
import os
import os.path as osp

import pytest
import torch
from mmpretrain.registry import MODELS
from repo_files import load_file

BACKBONE = dict(type='DinoVim', arch=dict(embed_dims=32, num_layers=1), img_size=32,
                patch_size=8, mixer_cfg=dict(d_state=8, headdim=16))


def _tool():
    return load_file('tools/model_converters/extract_backbone.py')


@pytest.fixture
def dino_ckpt(tmp_path):
    model = MODELS.build(dict(type='DINO', backbone=BACKBONE,
                              head=dict(type='DINOHead', in_channels=32, out_channels=16,
                                        hidden_channels=16, bottleneck_channels=8)))
    with torch.no_grad():  # make teacher and student differ
        for p in model.teacher.parameters():
            p.add_(torch.randn_like(p))
    path = tmp_path / 'epoch_3.pth'
    torch.save({'meta': {'epoch': 3, 'iter': 30}, 'state_dict': model.state_dict()}, path)
    return model, str(path)


@pytest.mark.parametrize('part', ['teacher', 'student'])
def test_extracts_loadable_backbone(dino_ckpt, tmp_path, part, capsys):
    model, ckpt = dino_ckpt
    out = str(tmp_path / f'{part}.pth')
    _tool().main([ckpt, out, '--part', part])
    assert f'{part} backbone' in capsys.readouterr().out
    saved = torch.load(out, map_location='cpu', weights_only=False)
    src = model.teacher['backbone'] if part == 'teacher' else model.backbone
    assert set(saved['state_dict']) == set(src.state_dict())
    assert saved['meta']['part'] == part and saved['meta']['epoch'] == 3
    fresh = MODELS.build(dict(BACKBONE, init_cfg=dict(type='Pretrained', checkpoint=out)))
    fresh.init_weights()
    for k, v in src.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(fresh.eval()(x)[-1], src.eval()(x)[-1])


def test_ddp_prefix_and_default_part(dino_ckpt, tmp_path):
    model, _ = dino_ckpt
    path = tmp_path / 'ddp.pth'
    torch.save({'state_dict': {f'module.{k}': v for k, v in model.state_dict().items()}}, path)
    out = tmp_path / 'out.pth'
    _tool().main([str(path), str(out)])
    saved = torch.load(out, map_location='cpu', weights_only=False)['state_dict']
    for k, v in model.teacher['backbone'].state_dict().items():
        assert torch.equal(saved[k], v), k


def test_clear_error_without_backbone_keys(tmp_path):
    path = tmp_path / 'classifier.pth'
    torch.save({'state_dict': {'head.fc.weight': torch.zeros(2, 2), 'neck.x': torch.zeros(1)}},
               path)
    with pytest.raises(SystemExit, match=r"classifier\.pth: no teacher backbone keys .*"
                       r"'teacher\.backbone\.'.*\['head\.fc', 'neck\.x'\]"):
        _tool().main([str(path), str(tmp_path / 'out.pth')])
    assert not (tmp_path / 'out.pth').exists()
    with pytest.raises(SystemExit, match='checkpoint not found'):
        _tool().main([str(tmp_path / 'missing.pth'), str(tmp_path / 'out.pth')])


def test_refuses_to_overwrite_input(dino_ckpt):
    _, ckpt = dino_ckpt
    before = open(ckpt, 'rb').read()
    with pytest.raises(SystemExit, match='refusing to overwrite'):
        _tool().main([ckpt, ckpt])
    with pytest.raises(SystemExit, match='refusing to overwrite'):
        _tool().main([ckpt, osp.join(osp.dirname(ckpt), '.', osp.basename(ckpt))])
    link = osp.join(osp.dirname(ckpt), 'link.pth')
    os.symlink(ckpt, link)
    with pytest.raises(SystemExit, match='refusing to overwrite'):
        _tool().main([ckpt, link])
    assert open(ckpt, 'rb').read() == before


def test_extracted_backbone_keeps_the_token_layout(dino_ckpt, tmp_path):
    """The DINO checkpoint records the middle-cls layout; the extracted file keeps the record,
    so loading it into a legacy-layout DinoVim is an error instead of other features."""
    from mmdinomamba.models.utils import CheckpointMismatchError
    _, ckpt = dino_ckpt
    out = str(tmp_path / 'teacher.pth')
    _tool().main([ckpt, out])
    legacy = MODELS.build(dict(BACKBONE, legacy_dinomamba_layout=True,
                               init_cfg=dict(type='Pretrained', checkpoint=out)))
    with pytest.raises(CheckpointMismatchError,
                       match=r"teacher\.pth.*'middle_cls'.*legacy_dinomamba_layout=False"):
        legacy.init_weights()
