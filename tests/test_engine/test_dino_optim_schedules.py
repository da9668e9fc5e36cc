"""The DINO optimizer setup of the paper configs: student-only parameter groups, DINO's
weight-decay rule, and the lr / weight-decay schedules at chosen iterations."""
import copy
import math
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope
from mmpretrain.registry import MODELS, PARAM_SCHEDULERS

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
SCHEDULE = osp.join(ROOT, 'configs/_base_/schedules/dino_adamw-coslr-100e.py')


def tiny_dino():
    return MODELS.build(dict(
        type='DINO',
        backbone=dict(type='DinoVim', arch=dict(embed_dims=16, num_layers=1), img_size=16,
                      patch_size=8, mixer_cfg=dict(d_state=8, headdim=8)),
        head=dict(type='DINOHead', in_channels=16, out_channels=16, hidden_channels=16,
                  bottleneck_channels=8)))


def _build(model):
    init_default_scope('mmpretrain')
    cfg = Config.fromfile(SCHEDULE)
    optim_cfg = copy.deepcopy(cfg.optim_wrapper)
    optim_cfg.type = 'DINOOptimWrapper'  # bf16 AMP needs a GPU; the groups are the same
    optim_cfg.pop('dtype')
    return cfg, build_optim_wrapper(model, optim_cfg)


def test_only_student_parameters_with_dino_weight_decay_rule():
    model = tiny_dino()
    cfg, wrapper = _build(model)
    assert cfg.optim_wrapper.clip_grad == dict(max_norm=3.0, per_param=True)
    ids = {id(p): n for n, p in model.named_parameters()}
    groups = {ids[id(p)]: g['weight_decay'] for g in wrapper.optimizer.param_groups
              for p in g['params']}
    assert not any(n.startswith('teacher.') for n in groups)
    trainable = {n for n, p in model.named_parameters()
                 if p.requires_grad and not n.startswith('teacher.')}
    assert set(groups) == trainable
    for name, wd in groups.items():  # DINO: no decay for biases and 1-D parameters
        param = dict(model.named_parameters())[name]
        assert wd == (0. if param.ndim == 1 else 0.04), name
    assert 'head.last_layer.weight_g' not in groups  # frozen unit scale


def test_lr_and_weight_decay_schedules_at_chosen_iterations():
    model = tiny_dino()
    cfg, wrapper = _build(model)
    E = 3  # iterations per epoch -> 300 iterations, 30 of warm-up
    scheds = [PARAM_SCHEDULERS.build(c, default_args=dict(optimizer=wrapper, epoch_length=E))
              for c in cfg.param_scheduler]
    base_lr, N, W = 5e-4, 100 * E, 10 * E
    decay_group = next(g for g in wrapper.optimizer.param_groups if g['weight_decay'] > 0)
    flat_group = next(g for g in wrapper.optimizer.param_groups if g['weight_decay'] == 0)
    seen = {}
    for it in range(N):
        seen[it] = (decay_group['lr'], decay_group['weight_decay'], flat_group['weight_decay'])
        for s in scheds:
            s.step()
    for it in (0, 1, 15, 29, 30, 31, 150, 299):
        lr, wd, wd_flat = seen[it]
        if it < W:  # DINO: np.linspace(0, base_lr, W)[it] (mmengine: start_factor 1e-9)
            expected_lr = base_lr * (1e-9 + (1 - 1e-9) * it / (W - 1))
        else:
            expected_lr = 1e-6 + (base_lr - 1e-6) * (1 + math.cos(math.pi * (it - W) /
                                                                  (N - W))) / 2
        expected_wd = 0.4 + (0.04 - 0.4) * (1 + math.cos(math.pi * it / N)) / 2
        assert math.isclose(lr, expected_lr, rel_tol=1e-6, abs_tol=1e-15), it
        assert math.isclose(wd, expected_wd, rel_tol=1e-6), it
        assert wd_flat == 0., it
    assert cfg.auto_scale_lr == dict(base_batch_size=256, enable=True)


def test_per_parameter_gradient_clipping():
    from mmpretrain.registry import OPTIM_WRAPPERS
    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, 2))
    wrapper = OPTIM_WRAPPERS.build(dict(type='DINOOptimWrapper',
                                        optimizer=torch.optim.SGD([a, b], lr=0.),
                                        clip_grad=dict(max_norm=3.0, per_param=True)))
    a.grad = torch.tensor([3., 4., 0.])  # norm 5 -> clipped to 3
    b.grad = torch.full((2, 2), 0.5)  # norm 1 -> unchanged (a global clip would scale it)
    wrapper.step()
    torch.testing.assert_close(a.grad, torch.tensor([1.8, 2.4, 0.]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(b.grad, torch.full((2, 2), 0.5))
    assert wrapper.message_hub.get_scalar('train/grad_norm').current() == pytest.approx(5.)
    # deferred (as DINORuntimeInfoHook sets it): the norm waits on the device until read
    wrapper.defer_scalars = True
    a.grad = torch.tensor([0., 0., 6.])
    wrapper.step()
    (key, norm), = wrapper.pending_scalars
    assert key == 'train/grad_norm' and isinstance(norm, torch.Tensor)
    assert wrapper.message_hub.get_scalar('train/grad_norm').current() == pytest.approx(5.)
    wrapper.flush_pending_scalars()
    assert wrapper.message_hub.get_scalar('train/grad_norm').current() == pytest.approx(6.)
    assert wrapper.pending_scalars == []
    with pytest.raises(ValueError, match="per_param=True needs type='norm'"):
        OPTIM_WRAPPERS.build(dict(type='DINOOptimWrapper', optimizer=torch.optim.SGD([a], lr=0.),
                                  clip_grad=dict(type='value', clip_value=1., per_param=True)))


def test_foreach_clipping_equals_per_parameter_calls_bit_for_bit():
    from mmdinomamba.engine.dino_optim import clip_per_param_
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(64, 33, generator=g) * s for s in (1e-4, 0.05, 0.5, 2., 10.)] + [
        torch.zeros(7), torch.randn(3, generator=g) * 1e3]
    ref = [torch.nn.Parameter(torch.zeros_like(x)) for x in grads]
    new = [torch.nn.Parameter(torch.zeros_like(x)) for x in grads]
    for p, q, x in zip(ref, new, grads):
        p.grad, q.grad = x.clone(), x.clone()
    norms = [torch.nn.utils.clip_grad_norm_([p], max_norm=3.0) for p in ref]
    top = clip_per_param_(new, 3.0)
    for p, q in zip(ref, new):
        assert torch.equal(p.grad, q.grad)
    assert torch.equal(top, torch.stack(norms).max())
    # DINO's rule: scaled by max_norm / (norm + 1e-6) only where that is below 1
    for p, x in zip(new, grads):
        coef = 3.0 / (float(x.norm()) + 1e-6)
        torch.testing.assert_close(p.grad, x * min(coef, 1.), rtol=1e-6, atol=0)


def test_bf16_amp_wrapper_has_no_grad_scaler():
    from mmpretrain.registry import OPTIM_WRAPPERS
    w = torch.nn.Parameter(torch.ones(4))
    wrapper = OPTIM_WRAPPERS.build(dict(type='DINOAmpOptimWrapper', dtype='bfloat16',
                                        optimizer=torch.optim.SGD([w], lr=0.5),
                                        clip_grad=dict(max_norm=1.0, per_param=True)))
    assert wrapper.loss_scaler is None and wrapper.cast_dtype == torch.bfloat16
    lin = torch.nn.Linear(4, 1, bias=False)
    with wrapper.optim_context(lin):
        assert torch.is_autocast_enabled('cpu') or torch.is_autocast_enabled('cuda')
    wrapper.update_params((w * torch.tensor([3., 4., 0., 0.])).sum())  # grad norm 5 -> 1
    torch.testing.assert_close(w.detach(), torch.tensor([0.7, 0.6, 1., 1.]))
    state = wrapper.state_dict()
    assert 'loss_scaler' not in state
    state['loss_scaler'] = dict(scale=65536.)  # a checkpoint of the previous version loads
    wrapper.load_state_dict(state)
    with pytest.raises(ValueError, match='max_norm only'):
        OPTIM_WRAPPERS.build(dict(type='DINOOptimWrapper', optimizer=torch.optim.SGD([w], lr=0.),
                                  clip_grad=dict(max_norm=1., norm_type=1, per_param=True)))
