"""DINO algorithm: teacher without gradients, exact EMA, schedules, multi-crop batching."""
import math

import pytest
import torch
from mmpretrain.registry import MODELS

from mmdinomamba.models.selfsup.dino_schedules import (last_layer_frozen_at,
                                                       teacher_momentum_at, teacher_temp_at)

K = 32


def tiny_dino(backbone='ViT', **kw):
    arch = dict(embed_dims=32, num_layers=1)
    bb = dict(type=backbone, arch=arch, img_size=32, patch_size=8)
    if backbone in ('ViT', 'LinearViT'):
        arch['num_heads'] = 2
    else:
        bb['mixer_cfg'] = dict(d_state=8, headdim=16)
    cfg = dict(type='DINO', backbone=bb,
               head=dict(type='DINOHead', in_channels=32, out_channels=K, hidden_channels=16,
                         bottleneck_channels=8),
               warmup_teacher_temp=0.04, teacher_temp=0.07, warmup_teacher_temp_epochs=3,
               momentum_teacher=0.996, freeze_last_layer=1)
    cfg.update(kw)
    return MODELS.build(cfg)


def views(batch=2, n_local=2, g=32, loc=16):
    gen = torch.Generator().manual_seed(3)
    return ([torch.randn(batch, 3, g, g, generator=gen) for _ in range(2)] +
            [torch.randn(batch, 3, loc, loc, generator=gen) for _ in range(n_local)])


def test_teacher_starts_equal_and_gets_no_gradients():
    model = tiny_dino()
    model.init_weights()
    for name in ('backbone', 'head'):
        s, t = getattr(model, name).state_dict(), model.teacher[name].state_dict()
        assert all(torch.equal(s[k], t[k]) for k in s)
    model.train()
    assert not model.teacher.training and model.backbone.training
    model.set_progress(10, 100, 5)  # after the frozen epoch
    model.loss(views())['loss'].backward()
    assert all(not p.requires_grad and p.grad is None for p in model.teacher.parameters())
    trainable = [p for p in model.backbone.parameters()] + list(model.head.parameters())
    assert all(p.grad is not None for p in trainable if p.requires_grad)
    assert {'teacher.backbone.pos_embed', 'dino_loss.center'} <= set(model.state_dict())


@pytest.mark.parametrize('backbone', ['ViT', 'DinoVim'])
def test_one_step_teacher_is_exact_ema(backbone):
    model = tiny_dino(backbone).train()
    model.set_progress(7, 20, 5)
    m = model.momentum
    assert m == teacher_momentum_at(7, 20, 0.996, 1.0)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    t0 = {k: v.clone() for k, v in model.teacher.state_dict().items()}
    model.loss(views())['loss'].backward()
    opt.step()
    model.update_teacher()
    for name in ('backbone', 'head'):
        for (k, s), (_, t) in zip(getattr(model, name).named_parameters(),
                                  model.teacher[name].named_parameters()):
            if not s.requires_grad:  # frozen scale g: equal in both, untouched
                assert torch.equal(t, s), k
                continue
            expected = m * t0[f'{name}.{k}'] + (1 - m) * s
            assert torch.equal(t, expected), k
            assert not torch.equal(t, t0[f'{name}.{k}']), k


def test_schedules_take_configured_values():
    model = tiny_dino(warmup_teacher_temp_epochs=30, freeze_last_layer=1).train()
    E, N = 10, 1000  # 10 iterations per epoch, 100 epochs
    cases = {0: (0.04, 0.996), 9: (0.04, teacher_momentum_at(9, N)),
             150: (0.04 + 0.03 * 15 / 29, teacher_momentum_at(150, N)),
             290: (0.07, teacher_momentum_at(290, N)), 500: (0.07, 0.998),
             999: (0.07, 1 - 0.002 * (1 + math.cos(math.pi * 999 / N)))}
    for it, (temp, mom) in cases.items():
        model.set_progress(it, N, E)
        assert math.isclose(model.teacher_temp, temp, rel_tol=1e-12), it
        assert math.isclose(model.momentum, mom, rel_tol=1e-12), it
        assert model.last_layer_frozen == (it < E)
        out = model.loss(views(n_local=1))
        assert math.isclose(out['teacher_temp'].item(), temp, rel_tol=1e-6)
        assert math.isclose(out['momentum'].item(), mom, rel_tol=1e-6)
    assert teacher_temp_at(0, 5, 0.04, 0.07, 0) == 0.07  # no warm-up
    assert teacher_momentum_at(N, N) == 1.0
    assert last_layer_frozen_at(4, 10, 0.5) and not last_layer_frozen_at(5, 10, 0.5)


def test_last_layer_frozen_during_first_epoch():
    model = tiny_dino(head=dict(type='DINOHead', in_channels=32, out_channels=K,
                                hidden_channels=16, bottleneck_channels=8,
                                norm_last_layer=False)).train()
    last = model.head.last_layer
    model.set_progress(4, 100, 5)  # epoch 0
    model.loss(views())['loss'].backward()
    assert last.weight_v.grad is None and last.weight_g.grad is None
    assert model.head.mlp[0].weight.grad is not None
    model.zero_grad(set_to_none=True)
    model.set_progress(5, 100, 5)  # epoch 1
    model.loss(views())['loss'].backward()
    assert last.weight_v.grad is not None and last.weight_g.grad is not None


def test_multicrop_runs_backbone_once_per_resolution():
    model = tiny_dino().train()
    model.set_progress(0, 10, 5)
    calls = {'student': [], 'teacher': []}
    model.backbone.register_forward_hook(
        lambda m, i, o: calls['student'].append(tuple(i[0].shape)))
    model.teacher['backbone'].register_forward_hook(
        lambda m, i, o: calls['teacher'].append(tuple(i[0].shape)))
    out = model.loss(views(batch=3, n_local=4))
    assert calls['student'] == [(6, 3, 32, 32), (12, 3, 16, 16)]
    assert calls['teacher'] == [(6, 3, 32, 32)]
    assert set(out) == {'loss', 'teacher_entropy', 'teacher_batch_entropy', 'prototypes_used',
                        'kl', 'center_norm', 'teacher_temp', 'momentum'}
    assert 1 <= out['prototypes_used'] <= 6  # 2 global views x batch 3
    assert out['loss'].requires_grad
    assert all(not v.requires_grad for k, v in out.items() if k != 'loss')


def test_center_updates_only_in_training():
    model = tiny_dino()
    model.set_progress(0, 10, 5)
    model.eval()
    model.loss(views())
    assert model.dino_loss.center.abs().sum() == 0
    model.train()
    model.loss(views())
    assert model.dino_loss.center.abs().sum() > 0


def test_clear_errors():
    model = tiny_dino().train()
    with pytest.raises(RuntimeError, match="DINOTeacherHook"):
        model.loss(views())
    model.set_progress(0, 10, 5)
    with pytest.raises(ValueError, match='more than 2 view batches'):
        model.loss(views()[:2])
    with pytest.raises(ValueError, match='iteration'):
        model.set_progress(11, 10, 5)
    with pytest.raises(ValueError, match="out_type='featmap'"):
        MODELS.build(dict(type='DINO', head=dict(type='DINOHead', in_channels=32, out_channels=K),
                          backbone=dict(type='ViT', arch=dict(embed_dims=32, num_layers=1,
                                                              num_heads=2), out_type='featmap')))


def test_init_weights_keeps_loaded_teacher_when_init_cfg_given(tmp_path):
    src = tiny_dino()
    with torch.no_grad():
        for p in src.teacher.parameters():
            p.add_(1.)
    path = tmp_path / 'dino.pth'
    torch.save({'state_dict': src.state_dict()}, path)
    model = tiny_dino(init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    for k, v in src.teacher.state_dict().items():
        assert torch.equal(model.teacher.state_dict()[k], v), k


def test_koleo_term_is_added_and_logged():
    model = tiny_dino(koleo_weight=0.5).train()
    plain = tiny_dino().train()
    plain.load_state_dict(model.state_dict())  # before the loss updates the center
    torch.manual_seed(0)
    data = views(batch=4)
    for m in (model, plain):
        m.set_progress(0, 10, 5)
    out, ref = model.loss(data), plain.loss(data)
    assert out['koleo'].isfinite() and not out['koleo'].requires_grad
    torch.testing.assert_close(out['loss'], ref['loss'] + 0.5 * out['koleo'])


def test_teacher_batchnorm_uses_batch_statistics_in_training():
    head = dict(type='DINOHead', in_channels=32, out_channels=16, hidden_channels=16,
                bottleneck_channels=8, use_bn=True)
    model = tiny_dino(head=head).train()
    bns = [m for m in model.teacher.modules() if isinstance(m, torch.nn.BatchNorm1d)]
    assert bns and all(m.training for m in bns)
    assert not model.teacher['backbone'].training
    model.eval()
    assert not any(m.training for m in bns)
