"""One DINO training iteration through mmengine's loop (data preprocessor, model, optimizer
wrapper with clipping, every hook of the config) makes no host-device synchronisation: the demo
config and the ImageNet DINO config (tiny sizes, CPU; see tests/sync_detector.py for what the
detector sees on a CPU)."""
import os.path as osp
import sys

import pytest
import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.runner import Runner

TESTS = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, TESTS)
from sync_detector import HostSyncError, SyncDetector  # noqa: E402

ROOT = osp.dirname(TESTS)
DEMO = osp.join(ROOT, 'configs/pretrain/dino_dinovim-demo_1xb32-14e_embedded-64px.py')
IMAGENET = osp.join(ROOT, 'configs/pretrain/dino_dinovim-b-p16_4xb48-100e_in1k.py')
#: The CPU kernels check whether any (sample, head) decays strongly (``wide.any()``, forward and
#: backward) and gather those with nonzero; on CUDA the Triton kernels run instead of all of them.
CPU_ONLY = (('mmdinomamba/ops/cpu/ssd_quadratic.py', 'scan_forward'),
            ('mmdinomamba/ops/cpu/ssd_quadratic.py', 'scan_backward'),
            ('mmdinomamba/ops/cpu/bidir_inner.py', '_store_wide'),
            ('mmdinomamba/ops/cpu/bidir_inner.py', '_load_wide'))
CHECKED = 1  # iteration 0 warms up (first-call self-checks read values, as before a capture)


class Enter(Hook):
    priority = 'HIGHEST'

    def __init__(self, detector_factory):
        self.factory, self.detector = detector_factory, None

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if runner.iter == CHECKED:
            self.detector = self.factory(runner)
            self.detector.__enter__()


class Exit(Hook):
    priority = 'LOWEST'

    def __init__(self, enter):
        self.enter, self.done = enter, False

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if runner.iter == CHECKED:
            self.close()
            self.done = True

    def close(self):
        if self.enter.detector is not None and not self.done:
            self.enter.detector.__exit__(None, None, None)
            self.done = True


def _detector(runner, record=False):
    """Allows AdamW's step counters: CPU tensors also when training on a GPU."""
    steps = [s['step'] for s in runner.optim_wrapper.optimizer.state.values() if 'step' in s]
    return SyncDetector(allowed=CPU_ONLY, host_tensors=steps, record=record)


def _tiny(cfg, root, work_dir, crops):
    """Tiny sizes: 2 x 32 + 2 x 16 px crops of 12 embedded images, batch 4, 3 iterations."""
    cfg.work_dir = str(work_dir)
    m = cfg.model
    m.backbone.update(arch=dict(embed_dims=32, num_layers=2), img_size=32,
                      mixer_cfg=dict(d_state=8, headdim=16), patch_size=8)
    m.head.update(in_channels=32, out_channels=64, hidden_channels=32, bottleneck_channels=16)
    crop = next(t for t in cfg.train_dataloader.dataset.pipeline if t.type == 'DINOMultiCrop')
    crop.update(global_crop_size=32, local_crop_size=16, num_local_crops=crops)
    cfg.train_dataloader.update(batch_size=4, num_workers=0, persistent_workers=False)
    cfg.train_dataloader.dataset.update(type='EmbeddedShapes', data_root=str(root),
                                        split='train', indices=12)
    cfg.train_dataloader.dataset.pop('ann_file', None)
    cfg.train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=1)
    cfg.default_hooks.logger.interval = 10  # the signals are read after iteration 3 (epoch end)
    cfg.log_level = 'WARNING'
    cfg.custom_hooks = [h for h in cfg.custom_hooks if h.type != 'BinaryAUCHook']  # evaluation
    cfg.auto_scale_lr = dict(enable=False)
    for sched in cfg.param_scheduler:
        sched.update(by_epoch=False, begin=0, end=3)
        sched.pop('convert_to_iter_based', None)
    return cfg


def _imagenet_cfg(root, work_dir):
    cfg = Config.fromfile(IMAGENET)
    cfg.model.backbone.pop('arch')
    cfg = _tiny(cfg, root, work_dir, crops=2)
    # bf16 autocast on the CPU (the wrapper builds no GradScaler for bf16, so it runs here)
    assert cfg.optim_wrapper.type == 'DINOAmpOptimWrapper' and cfg.optim_wrapper.dtype == \
        'bfloat16'
    return cfg


CONFIGS = dict(demo=lambda root, wd: _tiny(Config.fromfile(DEMO), root, wd, crops=2),
               imagenet=_imagenet_cfg)


def _train(cfg, factory=_detector):
    runner = Runner.from_cfg(cfg)
    enter = Enter(factory)
    exit_ = Exit(enter)
    runner.register_hook(enter)
    runner.register_hook(exit_)
    try:
        runner.train()
    finally:
        exit_.close()  # a failure inside the checked iteration leaves no mode behind
    assert exit_.done and runner.iter == 3
    return runner, enter.detector


@pytest.mark.parametrize('name', sorted(CONFIGS))
def test_one_training_iteration_without_host_sync(embedded_root, tmp_path, name):
    cfg = CONFIGS[name](embedded_root, tmp_path)
    hooks = {h.type for h in cfg.custom_hooks}
    assert {'DINOTeacherHook', 'DINOCollapseMonitorHook'} <= hooks
    assert cfg.default_hooks.runtime_info.type == 'DINORuntimeInfoHook'
    runner, detector = _train(cfg)
    # the deferred values reached the message hub after the last iteration, one per iteration
    hub = runner.message_hub
    for key in ('loss', 'grad_norm', 'prototypes_used', 'teacher_temp'):
        assert len(hub.get_scalar(f'train/{key}').data[0]) == 3, key
    assert detector.found == []


def test_the_detector_sees_what_the_step_used_to_do(embedded_root, tmp_path):
    """The syncs of the previous step, put back, are caught: ``torch.unique`` and
    ``new_tensor`` in the collapse signals, the monitor's read after every iteration."""
    def old_prototype_count(p_t):
        used = torch.unique(p_t.argmax(dim=-1)).numel()
        return dict(teacher_entropy=p_t.new_zeros(()), teacher_batch_entropy=p_t.new_ones(()),
                    prototypes_used=p_t.new_tensor(float(used)))

    from mmdinomamba.models.heads import dino_loss
    cfg = CONFIGS['demo'](embedded_root, tmp_path)
    for hook in cfg.custom_hooks:  # reading the signals every iteration, as the monitor did
        if hook.type == 'DINOCollapseMonitorHook':
            hook.interval = 1
    mp = pytest.MonkeyPatch()
    mp.setattr(dino_loss, 'teacher_collapse_signals', old_prototype_count)
    try:
        runner, detector = _train(cfg, lambda r: _detector(r, record=True))
    finally:
        mp.undo()
    text = '\n'.join(detector.found)
    assert 'unique' in text and 'lift_fresh' in text and 'Tensor.tolist' in text, text


def test_detector_rules():
    x = torch.randn(4)
    with pytest.raises(HostSyncError, match='_local_scalar_dense.*test_dino_sync_free'):
        with SyncDetector():
            float(x.sum())
    for fn in (lambda: x.nonzero(), lambda: x[x > 0], lambda: torch.unique(x),
               lambda: x.new_tensor([1., 2.]), lambda: torch.tensor(3.)):
        with pytest.raises(HostSyncError):
            with SyncDetector():
                fn()
    with SyncDetector():  # device-side work only
        y = (x * 2).softmax(0).argmax()
        torch.zeros(4).scatter_(0, y.reshape(1), 1.).sum()
        x.new_full((), 3).fill_(2.)
    step = torch.tensor(3.)
    with SyncDetector(host_tensors=[step]):
        step.item()
    with pytest.raises(HostSyncError, match='Tensor.tolist'):  # no aten op on a CPU
        with SyncDetector():
            x.tolist()
    assert torch.Tensor.tolist(x) == x.tolist()  # restored


def test_data_preprocessor_equals_mmpretrains():
    from mmpretrain.registry import MODELS
    cfg = dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], to_rgb=True)
    ours = MODELS.build(dict(type='DINODataPreprocessor', **cfg))
    ref = MODELS.build(dict(type='SelfSupDataPreprocessor', **cfg))
    assert ours._non_blocking and not ref._non_blocking
    g = torch.Generator().manual_seed(0)
    data = dict(inputs=[torch.randint(0, 256, (2, 3, s, s), dtype=torch.uint8, generator=g)
                        for s in (16, 16, 8)], data_samples=None)
    a, b = ours(data, True), ref(data, True)
    assert all(torch.equal(x, y) for x, y in zip(a['inputs'], b['inputs']))
    with SyncDetector():
        ours(data, True)
    with pytest.raises(HostSyncError, match='lift_fresh'):  # mmpretrain's [2, 1, 0] index
        with SyncDetector():
            ref(data, True)


class _CudaSyncDebug:
    """``torch.cuda.set_sync_debug_mode('error')`` as the detector of one iteration."""
    found = ()

    def __enter__(self):
        torch.cuda.set_sync_debug_mode('error')
        return self

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode('default')


@pytest.mark.gpu
@pytest.mark.parametrize('name', sorted(CONFIGS))
def test_one_cuda_iteration_under_sync_debug_mode(embedded_root, tmp_path, name):
    """On a GPU, what the CPU detector cannot see (copies, the CUDA path): any synchronising
    CUDA call in the checked iteration raises."""
    cfg = CONFIGS[name](embedded_root, tmp_path)
    cfg.train_dataloader.pin_memory = True
    _train(cfg, lambda runner: _CudaSyncDebug())
