"""``tools/train.py --tensorboard``: losses, DINO collapse signals, Binary-AUC per layer and its
map figures reach TensorBoard event files (CPU, a few DINO iterations of the demo config on the
embedded data)."""
import glob
import importlib.util
import os.path as osp

import pytest
from repo_files import load_file

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DINO_DEMO = osp.join(ROOT, 'configs/pretrain/dino_dinovim-demo_1xb32-14e_embedded-64px.py')


def _config(tmp_path, root) -> str:
    """The DINO demo shrunk to 3 iterations, with its own Binary-AUC hook (example maps
    included) on the masked val split."""
    from mmengine.config import Config
    cfg = Config.fromfile(DINO_DEMO)
    cfg.model.backbone.arch.update(embed_dims=32, num_layers=2)
    cfg.model.head.in_channels = 32
    cfg.train_dataloader.update(batch_size=16, num_workers=0)
    cfg.train_dataloader.dataset.data_root = str(root)
    cfg.param_scheduler = [dict(type='ConstantLR', factor=1.0, by_epoch=False, begin=0, end=3)]
    cfg.train_cfg.max_epochs = 1
    cfg.default_hooks.logger.interval = 1
    hook, = [h for h in cfg.custom_hooks if h.type == 'BinaryAUCHook']
    assert hook.num_examples > 0  # the demo's TensorBoard run carries the maps
    hook.layers = [0, 1]
    hook.dataloader.batch_size = 8
    hook.dataloader.dataset.update(data_root=str(root), indices=16)
    path = tmp_path / 'dino_tb.py'
    cfg.dump(str(path))
    return str(path)


def test_train_writes_tensorboard_events(tmp_path, embedded_root):
    pytest.importorskip('tensorboard', reason='tensorboard is not installed (pip install '
                        'tensorboard; tools/setup_env.sh installs it)')
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    work = tmp_path / 'work'
    load_file('tools/train.py').main([_config(tmp_path, embedded_root), '--work-dir', str(work),
                                      '--tensorboard'])
    events = glob.glob(str(work / '*' / 'vis_data' / 'events.out.tfevents.*'))
    assert len(events) == 1, events
    acc = EventAccumulator(events[0], size_guidance={'images': 0, 'scalars': 0})
    acc.Reload()
    scalars = set(acc.Tags()['scalars'])
    assert {'loss', 'teacher_entropy', 'teacher_batch_entropy', 'prototypes_used'} <= scalars
    assert {'binary_auc/auc', 'binary_auc/auc/layer_0', 'binary_auc/auc/layer_1'} <= scalars
    assert len(acc.Scalars('loss')) == 3  # one per iteration (logger interval 1)
    assert 'binary_auc_img0' in acc.Tags()['images']


def test_missing_tensorboard_is_named(tmp_path, monkeypatch):
    train = load_file('tools/train.py')
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, 'find_spec',
                        lambda name, *a: None if name == 'tensorboard' else real(name, *a))
    args = train.parse_args([DINO_DEMO, '--work-dir', str(tmp_path), '--tensorboard'])
    with pytest.raises(ImportError, match='pip install tensorboard'):
        train.merge_args(train.load_config(DINO_DEMO), args)


def test_switch_adds_the_backend_once():
    from mmdinomamba.utils.cli import add_tensorboard, load_config
    cfg = load_config(DINO_DEMO)
    add_tensorboard(cfg)
    add_tensorboard(cfg)
    types = [b['type'] for b in cfg.visualizer.vis_backends]
    assert types.count('TensorboardVisBackend') == 1 and 'LocalVisBackend' in types
