"""DINORuntimeInfoHook logs what mmengine's RuntimeInfoHook logs (same values, same order, same
message-hub history), reading the device scalars only at the logging interval."""
import os.path as osp

from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.runner import Runner

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DEMO = osp.join(ROOT, 'configs/pretrain/dino_dinovim-demo_1xb32-14e_embedded-64px.py')


class Reads(Hook):
    """Counts the iterations after which the hub holds every value so far."""
    priority = 'BELOW_NORMAL'  # the LoggerHook's place

    def __init__(self):
        self.complete_after = []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        buf = runner.message_hub.log_scalars.get('train/loss')
        if buf is not None and len(buf.data[0]) == runner.iter + 1:
            self.complete_after.append(runner.iter + 1)


def _run(root, work_dir, runtime_info):
    cfg = Config.fromfile(DEMO)
    cfg.work_dir = str(work_dir)
    m = cfg.model
    m.backbone.update(arch=dict(embed_dims=32, num_layers=1), img_size=32,
                      mixer_cfg=dict(d_state=8, headdim=16))
    m.head.update(in_channels=32, out_channels=64, hidden_channels=32, bottleneck_channels=16)
    crop = cfg.train_dataloader.dataset.pipeline[1]
    crop.update(global_crop_size=32, local_crop_size=16, num_local_crops=1)
    cfg.train_dataloader.update(batch_size=8, num_workers=0)  # 48 images: 6 iterations
    cfg.train_dataloader.dataset.data_root = str(root)
    cfg.train_cfg.max_epochs = 1
    cfg.custom_hooks = [h for h in cfg.custom_hooks if h.type != 'BinaryAUCHook']
    cfg.default_hooks.logger.interval = 4
    cfg.default_hooks.runtime_info = dict(type=runtime_info)
    cfg.log_level = 'WARNING'
    runner = Runner.from_cfg(cfg)
    reads = Reads()
    runner.register_hook(reads)
    runner.train()
    return runner, reads


def test_same_history_as_mmengine(embedded_root, tmp_path):
    ref, ref_reads = _run(embedded_root, tmp_path / 'a', 'RuntimeInfoHook')
    new, new_reads = _run(embedded_root, tmp_path / 'b', 'DINORuntimeInfoHook')
    a, b = ref.message_hub.log_scalars, new.message_hub.log_scalars
    assert set(a) == set(b) and 'train/grad_norm' in b and 'train/prototypes_used' in b
    for key in a:
        if key in ('train/time', 'train/data_time'):
            continue
        assert a[key].data[0].tolist() == b[key].data[0].tolist(), key
    order = [k for k in a if k not in ('train/time', 'train/data_time')]
    assert [k for k in b if k in order] == order  # the log line lists them in the same order
    assert ref_reads.complete_after == [1, 2, 3, 4, 5, 6]
    assert new_reads.complete_after == [4, 6]  # the logging interval and the epoch end
