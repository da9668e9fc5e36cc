"""LinearProbe: frozen backbone (no gradient, eval mode under training), feature sizes and
values against the backbone's own API, DINO head init, strict checkpoint loading, feature cache."""
import copy

import pytest
import torch
from mmengine.optim import OptimWrapper
from mmpretrain.registry import MODELS
from mmpretrain.structures import DataSample

TINY = {
    'DinoVim': dict(type='DinoVim', arch=dict(embed_dims=32, num_layers=3),
                    mixer_cfg=dict(d_state=8, headdim=16), img_size=32, patch_size=8,
                    drop_path_rate=0.2),
    'MambaReg': dict(type='MambaReg', arch=dict(embed_dims=32, num_layers=3),
                     mixer_cfg=dict(d_state=8, headdim=16), img_size=32, patch_size=8,
                     num_registers=3),
    'ViT': dict(type='ViT', arch=dict(embed_dims=32, num_layers=3, num_heads=2), img_size=32,
                patch_size=8, drop_path_rate=0.2),
}
HEAD = dict(type='LinearClsHead', num_classes=5, loss=dict(type='CrossEntropyLoss'),
            init_cfg=dict(type='Normal', layer='Linear', std=0.01, bias=0.))


def build(backbone='DinoVim', **kw):
    cfg = dict(type='LinearProbe', backbone=copy.deepcopy(TINY[backbone]), head=dict(HEAD))
    cfg.update(kw)
    return MODELS.build(cfg)


def _spy(model, record):
    """Record ``backbone.training`` at every backbone call (``forward_layers``)."""
    original = model.backbone.forward_layers

    def spy(*args, **kwargs):
        record.append(model.backbone.training)
        return original(*args, **kwargs)

    model.backbone.forward_layers = spy


def _batch(n=4, size=32):
    g = torch.Generator().manual_seed(1)
    inputs = torch.randint(0, 255, (n, 3, size, size), generator=g).float()
    return dict(inputs=list(inputs),
                data_samples=[DataSample().set_gt_label(i % 5) for i in range(n)])


@pytest.mark.parametrize('backbone', ['DinoVim', 'ViT'])
@pytest.mark.parametrize('n,avgpool', [(1, False), (2, False), (3, True)])
def test_feature_size_and_values_match_backbone_api(backbone, n, avgpool):
    model = build(backbone, num_blocks=n, neck=dict(type='ProbeFeatureNeck', avgpool=avgpool),
                  feature_source='mixer' if backbone == 'DinoVim' else 'block')
    x = torch.randn(2, 3, 32, 32)
    (feat, ) = model.extract_feat(x)
    assert feat.shape == (2, 32 * n + 32 * int(avgpool))
    assert model.head.fc.in_features == feat.shape[1]
    bb = model.backbone
    ref = bb.get_intermediate_layers(x, n, source=model.feature_source)
    if avgpool:  # DINO: mean of the last block's patch tokens (final-normed residual stream)
        last = bb.forward_layers(x, [-1], source=model.feature_source)
        ref.append(last['tokens'][0][:, last['layout'].patch_index].mean(1))
    torch.testing.assert_close(feat, torch.cat(ref, 1))


def test_mambareg_cls_is_register_mean_and_registers_pooling_size():
    model = build('MambaReg', num_blocks=2)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model.extract_feat(x)[0],
                               torch.cat(model.backbone.get_intermediate_layers(x, 2), 1))
    regs = build('MambaReg', num_blocks=2, neck=dict(type='ProbeFeatureNeck', pooling='registers'))
    assert regs.extract_feat(x)[0].shape == (2, 2 * 3 * 32) and regs.head.fc.in_features == 192


def test_backbone_frozen_and_in_eval_mode_during_training():
    model = build('DinoVim', num_blocks=2)
    model.init_weights()
    before = {k: v.clone() for k, v in model.backbone.state_dict().items()}
    head_before = model.head.fc.weight.detach().clone()
    seen_modes = []
    _spy(model, seen_modes)
    model.train()
    assert model.training and model.head.training and not model.backbone.training
    assert not any(m.training for m in model.backbone.modules())  # drop path / norms too
    assert all(not p.requires_grad for p in model.backbone.parameters())
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9,
                                           weight_decay=0.1))
    for _ in range(2):
        model.train_step(_batch(), wrapper)
    assert seen_modes == [False, False]
    assert all(p.grad is None for p in model.backbone.parameters())
    for k, v in model.backbone.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert not torch.equal(model.head.fc.weight, head_before)


def test_head_init_is_dino_normal_001_zero_bias():
    model = build('ViT', num_blocks=3)
    model.head.fc.weight.data.fill_(1.)
    model.head.fc.bias.data.fill_(1.)
    model.init_weights()
    w = model.head.fc.weight
    assert abs(w.std().item() - 0.01) < 0.002 and abs(w.mean().item()) < 0.002
    assert torch.count_nonzero(model.head.fc.bias) == 0


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match='num_blocks=4'):
        build('ViT', num_blocks=4)
    with pytest.raises(ValueError, match='feature_source'):
        build('ViT', num_blocks=2, feature_source='residual')
    with pytest.raises(ValueError, match='head.in_channels=10'):
        build('ViT', num_blocks=2, head=dict(HEAD, in_channels=10))


def _save(path, state):
    torch.save(dict(state_dict=state, meta=dict()), path)
    return str(path)


def _pretrained(ckpt, prefix='teacher.backbone.'):
    bb = dict(TINY['DinoVim'], init_cfg=dict(type='Pretrained', checkpoint=ckpt, prefix=prefix))
    return MODELS.build(dict(type='LinearProbe', backbone=bb, head=dict(HEAD), num_blocks=1))


def test_loads_teacher_from_dino_checkpoint_strictly(tmp_path):
    teacher = MODELS.build(TINY['DinoVim']).state_dict()
    student = {k: torch.zeros_like(v) for k, v in teacher.items()}
    state = {**{f'teacher.backbone.{k}': v for k, v in teacher.items()},
             **{f'backbone.{k}': v for k, v in student.items()},
             'teacher.head.w': torch.ones(2), 'head.w': torch.ones(2)}
    ckpt = _save(tmp_path / 'dino.pth', state)
    model = _pretrained(ckpt)
    model.init_weights()
    for k, v in model.backbone.state_dict().items():
        assert torch.equal(v, teacher[k]), k
    # an extracted backbone-only file is recognized whatever the prefix
    bare = _save(tmp_path / 'bare.pth', teacher)
    model = _pretrained(bare)
    model.init_weights()
    assert torch.equal(model.backbone.pos_embed, teacher['pos_embed'])
    with pytest.raises(KeyError, match="prefix 'student.backbone.'"):
        _pretrained(ckpt, prefix='student.backbone.').init_weights()
    partial = _save(tmp_path / 'partial.pth', {f'teacher.backbone.{k}': v
                                               for k, v in list(teacher.items())[:-1]})
    with pytest.raises(RuntimeError, match=r"partial\.pth \(prefix 'teacher\.backbone\.'\) do "
                       r'not fit this model:\n  missing keys \(1\): norm\.weight'):
        _pretrained(partial).init_weights()


def test_no_checkpoint_means_random_init():
    for model in (_pretrained(None), build('DinoVim', num_blocks=1)):
        before = copy.deepcopy(model.backbone.state_dict())
        model.init_weights()
        for k, v in model.backbone.state_dict().items():
            assert torch.equal(v, before[k]), k


def test_feature_cache_is_exact_and_skips_the_backbone():
    model = build('DinoVim', num_blocks=2, feature_cache=True)
    calls = []
    _spy(model, calls)
    x = torch.randn(3, 3, 32, 32)
    model.feature_cache = None
    ref = model.extract_feat(x)[0]
    from mmdinomamba.models.classifiers.linear_probe import FeatureCache
    model.feature_cache = FeatureCache()
    calls.clear()
    torch.testing.assert_close(model.extract_feat(x)[0], ref)
    torch.testing.assert_close(model.extract_feat(x)[0], ref)
    assert len(calls) == 1  # the second call is served from the cache
    mixed = torch.cat([x[1:], torch.randn(1, 3, 32, 32)])
    out = model.extract_feat(mixed)[0]
    torch.testing.assert_close(out[:2], ref[1:])
    assert len(calls) == 2 and len(model.feature_cache.store) == 4
    model.load_state_dict(model.state_dict())
    assert len(model.feature_cache.store) == 0


def test_demo_config_trains_with_a_runner_and_keeps_the_backbone(embedded_root, tmp_path):
    """The demo probe config through mmengine's Runner (1 epoch on the small embedded set),
    backbone weights from a DINO-style checkpoint given as the README does (cfg option)."""
    import os.path as osp

    from mmengine.runner import Runner

    from mmdinomamba.utils.cli import load_config
    repo = osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
    cfg_path = osp.join(repo, 'configs/linear_probe/linear-probe_dinovim-demo_embedded-64px.py')
    probe = load_config(cfg_path)
    teacher = MODELS.build(probe.model.backbone.to_dict() | dict(init_cfg=None)).state_dict()
    ckpt = _save(tmp_path / 'dino.pth', {f'teacher.backbone.{k}': v for k, v in teacher.items()})
    cfg = load_config(cfg_path, {
        'model.backbone.init_cfg.checkpoint': ckpt, 'train_cfg.max_epochs': 1,
        'train_cfg.val_interval': 1,
        'train_dataloader.dataset.data_root': str(embedded_root),
        'val_dataloader.dataset.data_root': str(embedded_root),
        'train_dataloader.batch_size': 16})
    cfg.work_dir = str(tmp_path / 'work')
    runner = Runner.from_cfg(cfg)
    modes = []
    _spy(runner.model, modes)
    runner.train()
    model = runner.model
    assert modes and not any(modes)  # every backbone call happened in eval mode
    assert all(p.grad is None and not p.requires_grad for p in model.backbone.parameters())
    for k, v in model.backbone.state_dict().items():
        assert torch.equal(v, teacher[k]), k
    acc = runner.message_hub.get_scalar('val/accuracy/top1').current()
    assert 0 <= acc <= 100
