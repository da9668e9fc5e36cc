"""Kill a DINO run mid-epoch, ``--resume`` it, and get the uninterrupted run's losses and weights
(teacher, loss center, schedules and optimizer restored). Demo config, tiny sizes, CPU."""
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.runner import Runner

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
DEMO = osp.join(ROOT, 'configs/pretrain/dino_dinovim-demo_1xb32-14e_embedded-64px.py')


class Killed(Exception):
    pass


class Record(Hook):
    """Per-iteration loss and teacher temperature / momentum, and a simulated kill."""
    priority = 'LOWEST'

    def __init__(self, kill_at=None):
        self.losses, self.kill_at = {}, kill_at

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if runner.iter == self.kill_at:
            raise Killed

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.losses[runner.iter] = tuple(float(outputs[k].detach()) for k in
                                         ('loss', 'center_norm', 'teacher_temp', 'momentum'))


def _cfg(root, work_dir, name, resume=False):
    cfg = Config.fromfile(DEMO)
    cfg.work_dir, cfg.experiment_name, cfg.resume = str(work_dir), name, resume
    m = cfg.model
    m.backbone.update(arch=dict(embed_dims=32, num_layers=1), img_size=32,
                      mixer_cfg=dict(d_state=8, headdim=16))
    m.head.update(in_channels=32, out_channels=64, hidden_channels=32, bottleneck_channels=16)
    m.update(warmup_teacher_temp=0.03, teacher_temp=0.04, warmup_teacher_temp_epochs=3,
             freeze_last_layer=1)
    crop = cfg.train_dataloader.dataset.pipeline[1]
    crop.update(global_crop_size=32, local_crop_size=16, num_local_crops=2)
    cfg.train_dataloader.update(batch_size=8, num_workers=0)  # 48 images: 6 iterations / epoch
    cfg.train_dataloader.dataset.data_root = str(root)
    for hook in cfg.custom_hooks:  # the Binary-AUC hook reads the same small data set
        if hook.type == 'BinaryAUCHook':
            hook.dataloader.dataset.data_root = str(root)
    cfg.train_cfg.max_epochs = 3
    for sched in cfg.param_scheduler[1:]:  # cosine lr / weight decay over the 3 epochs
        sched.end = 3
    cfg.default_hooks.logger.interval = 1
    cfg.default_hooks.checkpoint.max_keep_ckpts = 5
    cfg.log_level = 'WARNING'
    return cfg


def _run(cfg, record):
    runner = Runner.from_cfg(cfg)
    runner.register_hook(record)
    try:
        runner.train()
    except Killed:
        pass
    return runner


def test_resume_equals_uninterrupted_run(embedded_root, tmp_path):
    full = Record()
    runner = _run(_cfg(embedded_root, tmp_path / 'full', 'dino_full'), full)
    assert sorted(full.losses) == list(range(18))
    killed = Record(kill_at=8)  # dies in epoch 2, after the epoch-1 checkpoint
    _run(_cfg(embedded_root, tmp_path / 'part', 'dino_killed'), killed)
    assert sorted(killed.losses) == list(range(8))
    resumed = Record()
    _run(_cfg(embedded_root, tmp_path / 'part', 'dino_resumed', resume=True), resumed)
    assert sorted(resumed.losses) == list(range(6, 18))  # restarts after epoch 1
    for it in range(8):
        assert killed.losses[it] == full.losses[it], it
    for it in range(6, 18):
        assert resumed.losses[it] == full.losses[it], (it, resumed.losses[it], full.losses[it])
    temps = [full.losses[i][2] for i in (0, 6, 12)]  # warm-up over 3 epochs, by epoch
    assert temps == pytest.approx([0.03, 0.035, 0.04], abs=1e-7)
    a = torch.load(tmp_path / 'full' / 'epoch_3.pth', map_location='cpu', weights_only=False)
    b = torch.load(tmp_path / 'part' / 'epoch_3.pth', map_location='cpu', weights_only=False)
    assert {'teacher.backbone.pos_embed', 'dino_loss.center'} <= set(a['state_dict'])
    for k, v in a['state_dict'].items():
        assert torch.equal(b['state_dict'][k], v), k
    assert runner.iter == 18


@pytest.mark.parametrize('num_workers', [0, 2])
def test_resume_from_iteration_checkpoint_mid_epoch(embedded_root, tmp_path, num_workers):
    """Iteration checkpoints (``by_epoch=False``) with an epoch-based loop: the resumed run skips
    the batches of the interrupted epoch already trained and repeats the uninterrupted losses,
    also with data loader workers (whose random streams are replayed)."""
    def cfg(work_dir, name, resume=False):
        c = _cfg(embedded_root, work_dir, name, resume)
        c.default_hooks.checkpoint.update(by_epoch=False, interval=4)
        c.train_dataloader.update(num_workers=num_workers, persistent_workers=False)
        return c

    full = Record()
    _run(cfg(tmp_path / 'full', 'full'), full)
    _run(cfg(tmp_path / 'part', 'killed'), Record(kill_at=10))  # last checkpoint: iter_8
    with open(tmp_path / 'part' / 'last_checkpoint') as f:
        assert f.read().strip().endswith('iter_8.pth')
    resumed = Record()
    runner = _run(cfg(tmp_path / 'part', 'resumed', resume=True), resumed)
    assert sorted(resumed.losses) == list(range(8, 18))  # epoch 2 continues after 2 batches
    for it in range(8, 18):
        assert resumed.losses[it] == full.losses[it], (it, resumed.losses[it], full.losses[it])
    assert runner.iter == 18 and runner.epoch == 3


class Crops(Hook):
    """The first global crop of every image, per epoch: {epoch: {img_path: uint8 tensor}}."""
    priority = 'LOWEST'

    def __init__(self):
        self.crops = {}

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        crops = self.crops.setdefault(runner.epoch, {})
        for img, sample in zip(data_batch['inputs'][0], data_batch['data_samples']):
            crops[sample.img_path] = img.clone()


@pytest.mark.parametrize('num_workers', [0, 2])
def test_every_epoch_draws_new_augmentations(embedded_root, tmp_path, num_workers):
    cfg = _cfg(embedded_root, tmp_path, 'crops')
    cfg.train_cfg.max_epochs = 2
    cfg.train_dataloader.update(num_workers=num_workers, persistent_workers=False)
    # Without shuffling every image meets the same point of the same worker's random stream
    # in both epochs: the augmentations differ only if the streams do.
    cfg.train_dataloader.sampler.shuffle = False
    crops = Crops()
    _run(cfg, crops)
    first, second = crops.crops[0], crops.crops[1]
    assert set(first) == set(second) and len(first) == 48
    same = [p for p in first if torch.equal(first[p], second[p])]
    assert not same, f'{len(same)} of 48 images got the same crop in epochs 1 and 2'


def test_mid_epoch_resume_without_epoch_seed_hook_is_refused(embedded_root, tmp_path):
    def cfg(name, resume=False):
        c = _cfg(embedded_root, tmp_path, name, resume)
        c.custom_hooks = [h for h in c.custom_hooks if h.type != 'EpochSeedHook']
        c.default_hooks.checkpoint.update(by_epoch=False, interval=4)
        return c

    _run(cfg('killed'), Record(kill_at=5))  # iter_4: 4 of the 6 batches of epoch 1
    with pytest.raises(RuntimeError, match=r"iteration 4.*EpochSeedHook"):
        _run(cfg('resumed', resume=True), Record())


def test_resume_with_another_batch_size_is_refused(embedded_root, tmp_path):
    _run(_cfg(embedded_root, tmp_path, 'killed'), Record(kill_at=7))  # epoch_1.pth
    cfg = _cfg(embedded_root, tmp_path, 'resumed', resume=True)
    cfg.train_dataloader.batch_size = 16
    with pytest.raises(RuntimeError, match=r'made with 6 batches per epoch.*now has 3'):
        _run(cfg, Record())
