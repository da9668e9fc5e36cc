"""DINO hooks: progress + teacher update (with and without a DDP wrapper), collapse monitor."""
import math
from types import SimpleNamespace

import pytest
import torch
from mmpretrain.registry import HOOKS, MODELS

from mmdinomamba.engine.hooks import DINOCollapseMonitorHook, DINOTeacherHook
from mmdinomamba.models.selfsup.dino_schedules import teacher_momentum_at


def tiny_dino(out=16):
    return MODELS.build(dict(
        type='DINO',
        backbone=dict(type='ViT', arch=dict(embed_dims=16, num_layers=1, num_heads=2),
                      img_size=16, patch_size=8),
        head=dict(type='DINOHead', in_channels=16, out_channels=out, hidden_channels=16,
                  bottleneck_channels=8)))


def fake_runner(model, it=0, max_iters=40, epoch_len=8):
    return SimpleNamespace(model=model, iter=it, max_iters=max_iters, epoch=it // epoch_len,
                           train_dataloader=list(range(epoch_len)))


def _run_hook_iteration(runner, hook, dino):
    hook.before_train_iter(runner, 0)
    assert dino.progress == (runner.iter, runner.max_iters, len(runner.train_dataloader))
    t0 = [p.clone() for p in dino.teacher.parameters()]
    with torch.no_grad():
        for p in dino.head.parameters():
            p.add_(0.5)
    hook.after_train_iter(runner, 0)
    m = teacher_momentum_at(runner.iter, runner.max_iters)
    s = [p for n in ('backbone', 'head') for p in getattr(dino, n).parameters()]
    for t, before, sp in zip(dino.teacher.parameters(), t0, s):
        if sp.requires_grad:
            assert torch.equal(t, m * before + (1 - m) * sp)


def test_teacher_hook_sets_progress_and_updates_teacher():
    dino = tiny_dino()
    hook = HOOKS.build(dict(type='DINOTeacherHook'))
    assert hook.priority == 'ABOVE_NORMAL'
    runner = fake_runner(dino, it=13)
    hook.before_train(runner)
    _run_hook_iteration(runner, hook, dino)


def test_teacher_hook_through_ddp_wrapper(tmp_path):
    from mmengine.model import MMDistributedDataParallel
    dist = torch.distributed
    dist.init_process_group('gloo', init_method=f'file://{tmp_path}/pg', rank=0, world_size=1)
    try:
        dino = tiny_dino()
        wrapped = MMDistributedDataParallel(dino, find_unused_parameters=True)
        runner = fake_runner(wrapped, it=5)
        _run_hook_iteration(runner, DINOTeacherHook(), dino)
        # the center update goes through mmengine.dist.all_reduce (world size 1 here)
        dino.dino_loss.update_center(torch.ones(4, 16))
        torch.testing.assert_close(dino.dino_loss.center, torch.full((1, 16), 0.1))
    finally:
        dist.destroy_process_group()


def test_teacher_hook_rejects_other_models():
    with pytest.raises(TypeError, match='no set_progress'):
        DINOTeacherHook().before_train(fake_runner(torch.nn.Linear(2, 2)))


def _outputs(loss=5., entropy=2., kl=1.):
    return dict(loss=torch.tensor(loss), teacher_entropy=torch.tensor(entropy),
                kl=torch.tensor(kl))


def test_collapse_monitor_stops_on_nan_and_inf():
    hook = DINOCollapseMonitorHook()
    runner = fake_runner(tiny_dino(), it=41)
    hook.before_train(runner)
    with pytest.raises(RuntimeError, match=r'iteration 42 .*loss is nan.*learning rate'):
        hook.after_train_iter(runner, 0, outputs=_outputs(loss=float('nan')))
    with pytest.raises(RuntimeError, match='kl is inf'):
        hook.after_train_iter(runner, 0, outputs=_outputs(kl=float('inf')))


@pytest.mark.parametrize('ratio,kind', [(0.999, 'uniform'), (0.001, 'one-dimension')])
def test_collapse_monitor_patience(ratio, kind):
    hook = DINOCollapseMonitorHook(patience=3, begin_iter=2)
    runner = fake_runner(tiny_dino(out=64))
    hook.before_train(runner)
    assert hook.out_dim == 64
    bad = _outputs(entropy=ratio * math.log(64), kl=1e-4)
    for it in range(2):  # before begin_iter: not counted
        runner.iter = it
        hook.after_train_iter(runner, 0, outputs=bad)
    runner.iter = 2
    hook.after_train_iter(runner, 0, outputs=bad)
    runner.iter = 3
    hook.after_train_iter(runner, 0, outputs=_outputs(entropy=0.5 * math.log(64)))  # resets
    for it in (4, 5):
        runner.iter = it
        hook.after_train_iter(runner, 0, outputs=bad)
    runner.iter = 6
    with pytest.raises(RuntimeError, match=rf'iteration 7 .*{kind} collapse.*teacher_entropy = '
                       r'[0-9.]+ nats .*3 consecutive iterations since iteration 5.*Try'):
        hook.after_train_iter(runner, 0, outputs=bad)


def test_collapse_monitor_arguments():
    with pytest.raises(ValueError, match='patience=0'):
        DINOCollapseMonitorHook(patience=0)
    with pytest.raises(ValueError, match='min_entropy_ratio'):
        DINOCollapseMonitorHook(min_entropy_ratio=0.5, max_entropy_ratio=0.4)
