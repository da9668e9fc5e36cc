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


def _outputs(loss=5., entropy=2., batch_entropy=4., kl=1.):
    return dict(loss=torch.tensor(loss), teacher_entropy=torch.tensor(entropy),
                teacher_batch_entropy=torch.tensor(batch_entropy), kl=torch.tensor(kl),
                prototypes_used=torch.tensor(10.))


def _signals(probs):
    from mmdinomamba.models.heads import teacher_collapse_signals
    return {k: float(v) for k, v in teacher_collapse_signals(probs).items()}


def synthetic_teacher(kind, n=64, k=256, seed=0):
    """(n, k) teacher distributions of a known state."""
    g = torch.Generator().manual_seed(seed)
    if kind == 'sharp-diverse':  # sharp, argmax spread over 44 prototypes
        logits = torch.randn(n, k, generator=g)
        logits[torch.arange(n), torch.randint(0, 44, (n,), generator=g)] += 30.
    elif kind == 'one-prototype':  # blurry but every image piles onto the same prototype
        logits = torch.randn(n, k, generator=g) * 0.3
        logits[:, 7] += 5.2
    elif kind == 'one-dimension-sharp':
        logits = torch.randn(n, k, generator=g) * 0.3
        logits[:, 3] += 40.
    elif kind == 'uniform':
        logits = torch.randn(n, k, generator=g) * 1e-3
    return logits.softmax(dim=-1)


@pytest.mark.parametrize('kind,expected', [
    ('sharp-diverse', None), ('one-prototype', 'one-dimension'),
    ('one-dimension-sharp', 'one-dimension'), ('uniform', 'uniform')])
def test_collapse_signals_tell_the_states_apart(kind, expected):
    from mmdinomamba.engine.hooks.dino_collapse_hook import collapse_kind
    sig = _signals(synthetic_teacher(kind))
    assert collapse_kind(sig['teacher_entropy'], sig['teacher_batch_entropy'],
                         math.log(256)) == expected
    if kind == 'sharp-diverse':  # sharp per image, yet healthy: the old per-image rule fired
        assert sig['teacher_entropy'] < 0.01 * math.log(256)
        assert 30 <= sig['prototypes_used'] <= 44
    if kind == 'one-prototype':  # a high per-image entropy that the old rule accepted
        assert 0.3 * math.log(256) < sig['teacher_entropy'] < 0.995 * math.log(256)
        assert sig['prototypes_used'] == 1


def test_collapse_signals_formulas():
    p = torch.tensor([[1., 0., 0., 0.], [0., 1., 0., 0.], [.5, .5, 0., 0.]])
    sig = _signals(p)
    assert sig['teacher_entropy'] == pytest.approx(math.log(2) / 3, abs=1e-6)
    mean = torch.tensor([.5, .5, 0., 0.])
    assert sig['teacher_batch_entropy'] == pytest.approx(math.log(2), abs=1e-6)
    assert sig['prototypes_used'] == 2  # the tie of row 3 goes to prototype 0
    assert mean.sum() == 1


def test_collapse_monitor_stops_on_nan_and_inf():
    hook = DINOCollapseMonitorHook()
    runner = fake_runner(tiny_dino(), it=41)
    hook.before_train(runner)
    with pytest.raises(RuntimeError, match=r'iteration 42 .*loss is nan.*learning rate'):
        hook.after_train_iter(runner, 0, outputs=_outputs(loss=float('nan')))
    with pytest.raises(RuntimeError, match='kl is inf'):
        hook.after_train_iter(runner, 0, outputs=_outputs(kl=float('inf')))
    with pytest.raises(RuntimeError, match='teacher_batch_entropy is nan'):
        hook.after_train_iter(runner, 0, outputs=_outputs(batch_entropy=float('nan')))


@pytest.mark.parametrize('kind,name', [('uniform', 'uniform'),
                                       ('one-prototype', 'one-dimension'),
                                       ('one-dimension-sharp', 'one-dimension')])
def test_collapse_monitor_patience(kind, name):
    hook = DINOCollapseMonitorHook(patience=3, begin_iter=2)
    runner = fake_runner(tiny_dino(out=256))
    hook.before_train(runner)
    assert hook.out_dim == 256
    sig = _signals(synthetic_teacher(kind))
    bad = _outputs(entropy=sig['teacher_entropy'], batch_entropy=sig['teacher_batch_entropy'],
                   kl=1e-4)
    good_sig = _signals(synthetic_teacher('sharp-diverse'))
    good = _outputs(entropy=good_sig['teacher_entropy'],
                    batch_entropy=good_sig['teacher_batch_entropy'])
    for it in range(2):  # before begin_iter: not counted
        runner.iter = it
        hook.after_train_iter(runner, 0, outputs=bad)
    runner.iter = 2
    hook.after_train_iter(runner, 0, outputs=bad)
    runner.iter = 3
    hook.after_train_iter(runner, 0, outputs=good)  # resets
    for it in (4, 5):
        runner.iter = it
        hook.after_train_iter(runner, 0, outputs=bad)
    runner.iter = 6
    with pytest.raises(RuntimeError, match=rf'iteration 7 .*{name} collapse.*3 consecutive '
                       r'iterations since iteration 5.*teacher_entropy = [0-9.]+ nats.*'
                       r'teacher_batch_entropy = [0-9.]+ nats.*prototypes_used.*Try'):
        hook.after_train_iter(runner, 0, outputs=bad)


def test_collapse_monitor_quiet_on_a_sharp_diverse_teacher():
    hook = DINOCollapseMonitorHook(patience=1)
    runner = fake_runner(tiny_dino(out=256))
    hook.before_train(runner)
    for seed in range(5):
        sig = _signals(synthetic_teacher('sharp-diverse', seed=seed))
        runner.iter = seed
        hook.after_train_iter(runner, 0, outputs=_outputs(
            entropy=sig['teacher_entropy'], batch_entropy=sig['teacher_batch_entropy']))


def test_collapse_monitor_arguments():
    with pytest.raises(ValueError, match='patience=0'):
        DINOCollapseMonitorHook(patience=0)
    with pytest.raises(ValueError, match='min_info_ratio'):
        DINOCollapseMonitorHook(min_info_ratio=1.5)


def test_collapse_monitor_reads_every_interval_and_names_the_iteration():
    """Signals kept on the device are read every ``interval`` iterations; a NaN of iteration 6
    stops the run at the read after iteration 8, naming iteration 6."""
    hook = DINOCollapseMonitorHook(interval=4)
    runner = fake_runner(tiny_dino(), max_iters=40, epoch_len=40)
    hook.before_train(runner)
    for it in range(7):
        runner.iter = it
        out = _outputs(loss=float('nan') if it == 5 else 5.)
        if it == 3:  # the read after iteration 4 sees no NaN yet
            hook.after_train_iter(runner, it, outputs=out)
            assert hook._pending == []
            continue
        hook.after_train_iter(runner, it, outputs=out)  # no read: no error yet
    runner.iter = 7
    with pytest.raises(RuntimeError, match=r'iteration 6 .*loss is nan'):
        hook.after_train_iter(runner, 7, outputs=_outputs())
    with pytest.raises(ValueError, match='interval=0'):
        DINOCollapseMonitorHook(interval=0)


def test_collapse_monitor_interval_defaults_to_the_logger():
    from mmengine.hooks import LoggerHook
    hook = DINOCollapseMonitorHook()
    runner = fake_runner(tiny_dino())
    runner.hooks = [LoggerHook(interval=7)]
    hook.before_train(runner)
    assert hook._every == 7


def test_to_host_keeps_types_and_values():
    from mmdinomamba.engine.hooks.device_scalars import to_host
    vals = [torch.tensor(0.1), torch.tensor(3), 2.5, torch.tensor(True),
            torch.tensor(0.1, dtype=torch.bfloat16), torch.tensor([7.])]
    out = to_host(vals)
    assert out == [torch.tensor(0.1).item(), 3, 2.5, True,
                   torch.tensor(0.1, dtype=torch.bfloat16).item(), 7.]
    assert [type(v) for v in out] == [float, int, float, bool, float, float]
    with pytest.raises(ValueError, match='one element'):
        to_host([torch.zeros(2)])


def test_collapse_hint_names_the_runs_settings():
    """The advice names the run's own teacher temperature and momentum, and suggests
    Sinkhorn-Knopp centering only where the run does not use it already."""
    from mmdinomamba.engine.hooks.dino_collapse_hook import collapse_hint
    dino = tiny_dino()
    for kind in ('uniform', 'one-dimension'):
        assert 'Sinkhorn-Knopp' in collapse_hint(kind)  # no model: the plain hint
        hint = collapse_hint(kind, dino)  # DINO's EMA centering
        assert 'Sinkhorn-Knopp' in hint
        assert 'teacher_temp = 0.04' in hint and 'momentum_teacher = 0.996' in hint
        assert 'koleo_weight' not in hint
    sk = MODELS.build(dict(
        type='DINO', koleo_weight=1.0, teacher_temp=0.02, momentum_teacher=0.99,
        loss=dict(type='DINOLoss', centering='sinkhorn_knopp'),
        backbone=dict(type='ViT', arch=dict(embed_dims=16, num_layers=1, num_heads=2),
                      img_size=16, patch_size=8),
        head=dict(type='DINOHead', in_channels=16, out_channels=16, hidden_channels=16,
                  bottleneck_channels=8)))
    hint = collapse_hint('uniform', sk)
    assert 'Sinkhorn-Knopp' not in hint and hint.startswith('The teacher output is ~uniform')
    hint = collapse_hint('one-dimension', sk)
    assert 'Sinkhorn-Knopp' not in hint and 'a lower center_momentum' in hint
    hint = collapse_hint('uniform', sk)
    assert 'teacher_temp = 0.02, momentum_teacher = 0.99, koleo_weight = 1' in hint
    # the monitor's error carries it
    hook = DINOCollapseMonitorHook(patience=1)
    hook.before_train(fake_runner(sk))
    sig = _signals(synthetic_teacher('uniform'))
    with pytest.raises(RuntimeError, match='The run has teacher_temp = 0.02') as err:
        hook._check_collapse(0, 1, sig)
    assert 'Sinkhorn-Knopp' not in str(err.value)
