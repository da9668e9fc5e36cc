"""The demo end to end on tiny data: on a folder of your own (read only, no masks) and on the
embedded data (with masks), through ``tools/demo.py`` as a user runs it."""
import json
import os
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
# one iteration per epoch on the tiny data, one seed: the machinery, not the numbers
TINY = ['--seeds', '2', '--cfg-options', 'train_cfg.max_epochs=2',
        'train_dataloader.batch_size=8', 'train_dataloader.num_workers=0']


def _own_folder(root, classes=('ring', 'bar', 'blob'), per_class=(4, 2), size=40,
                with_masks=False):
    """A data folder in the documented layout that the project did not generate (JPEG images
    of another size than the demo's; PNG masks)."""
    rng = np.random.default_rng(0)
    with open(osp.join(root, 'classes.txt'), 'w') as f:
        f.write('\n'.join(classes) + '\n')
    os.makedirs(osp.join(root, 'meta'))
    for split, n in zip(('train', 'val'), per_class):
        lines = []
        for label, name in enumerate(classes):
            os.makedirs(osp.join(root, split, name))
            for i in range(n):
                img = rng.integers(0, 255, (size, size + 8, 3), dtype=np.uint8)
                img[10:30, 10 + 5 * label:30] = (40 * label, 200, 90)
                rel = f'{name}/{i}.jpg'
                Image.fromarray(img).save(osp.join(root, split, rel))
                if with_masks:
                    mask = np.zeros(img.shape[:2], np.uint8)
                    mask[10:30, 10 + 5 * label:30] = 255
                    os.makedirs(osp.join(root, 'masks', split, name), exist_ok=True)
                    Image.fromarray(mask).save(osp.join(root, 'masks', split, f'{name}/{i}.png'))
                lines.append(f'{rel} {label}')
        with open(osp.join(root, 'meta', f'{split}.txt'), 'w') as f:
            f.write('\n'.join(lines) + '\n')


def _snapshot(root):
    return sorted((osp.relpath(osp.join(d, f), root), os.stat(osp.join(d, f)).st_size,
                   os.stat(osp.join(d, f)).st_mtime_ns)
                  for d, _, files in os.walk(root) for f in files) + sorted(
                      osp.relpath(d, root) for d, _, _ in os.walk(root))


def _demo(args, cwd=REPO, status=0):
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')
    proc = subprocess.run([sys.executable, osp.join(REPO, 'tools/demo.py'), *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == status, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_demo_on_your_own_folder_reads_it_as_it_is(tmp_path):
    data = tmp_path / 'mine'
    data.mkdir()
    _own_folder(str(data), with_masks=True)
    before = _snapshot(str(data))
    out = _demo(['--data-root', str(data), '--work-dir', str(tmp_path / 'wd'), *TINY])
    assert _snapshot(str(data)) == before  # nothing written, regenerated or deleted
    summary = json.loads((tmp_path / 'wd' / 'summary.json').read_text())
    assert summary['num_classes'] == 3  # from classes.txt
    assert len(summary['knn_top1']['random']) == 2
    assert {'binary_auc_mean', 'binary_auc_best_layer'} <= set(summary)
    assert summary['knn_top1']['supervised'] >= 0  # the supervised baseline ran
    assert 'data_settings' in summary
    for name in ('training_curves', 'auc_per_layer', 'maps', 'heads', 'pca',
                 'auc_during_training'):
        png = tmp_path / 'wd' / f'{name}.png'
        assert png.is_file(), name
        assert Image.open(png).size[0] >= 800, name
    assert 'pretrain 2/2 (100%)' in out  # iteration / total on the console
    assert 'Binary-AUC at iteration 2' in out


def test_without_masks_binary_auc_is_skipped(tmp_path):
    from mmdinomamba.demo.data import prepare_data
    from repo_files import load_file
    demo = load_file('tools/demo.py')
    data_root = tmp_path / 'mine'
    data_root.mkdir()
    _own_folder(str(data_root))
    before = _snapshot(str(data_root))
    data = prepare_data(str(data_root), generate=False)
    assert data.classes == ['ring', 'bar', 'blob'] and not data.has_masks
    path = demo.run_config(demo.find_config('dinovim'), data, str(tmp_path / 'run'), {})
    from mmengine.config import Config
    cfg = Config.fromfile(path)
    assert cfg.train_dataloader.dataset.data_root == str(data_root)
    assert cfg.train_dataloader.dataset.type == 'ImageFolderWithMasks'
    assert 'BinaryAUCHook' not in [h['type'] for h in cfg.custom_hooks]
    from mmdinomamba.demo.report import build_summary, render_report
    result = dict(knn_top1=50., linear_top1=60., binary_auc=None)
    summary = build_summary(result, [result], [], len(data.classes), 64, 1.)
    assert 'binary_auc_mean' not in summary
    assert 'Binary-AUC: skipped' in render_report(summary, 'c', str(data_root), [], {})
    assert _snapshot(str(data_root)) == before


def test_demo_refuses_a_missing_folder(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS='1')
    proc = subprocess.run([sys.executable, osp.join(REPO, 'tools/demo.py'), '--data-root',
                           str(tmp_path / 'nope')], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0 and 'does not exist' in proc.stderr
    assert not (tmp_path / 'nope').exists()


@pytest.mark.parametrize('mixer,backbone', [('dinovim', 'DinoVim'), ('vit', 'ViT'),
                                            ('linearvit', 'LinearViT')])
def test_each_mixer_has_a_demo_config_with_the_same_recipe(mixer, backbone, tmp_path):
    from mmengine.config import Config

    from mmdinomamba.demo.data import prepare_data
    from repo_files import load_file
    demo = load_file('tools/demo.py')
    data_root = tmp_path / 'mine'
    data_root.mkdir()
    _own_folder(str(data_root), with_masks=True)
    data = prepare_data(str(data_root), generate=False)
    cfg = Config.fromfile(demo.run_config(demo.find_config(mixer), data, str(tmp_path / mixer),
                                          {}))
    ref = Config.fromfile(osp.join(REPO, demo.find_config('dinovim')))
    assert cfg.model.backbone.type == backbone
    assert cfg.model.backbone.arch.embed_dims == 64 and cfg.model.backbone.arch.num_layers == 4
    for key in ('train_cfg', 'optim_wrapper', 'param_scheduler'):
        assert cfg[key] == ref[key], key
    assert cfg.model.head == ref.model.head
    assert cfg.model.momentum_teacher == ref.model.momentum_teacher
    assert cfg.train_dataloader.dataset.pipeline == ref.train_dataloader.dataset.pipeline


@pytest.mark.timeout(600)
def test_a_forced_collapse_is_reported_not_crashed(tmp_path):
    """A teacher made uniform (temperature 100) collapses at once: the monitor stops the
    pretraining, the demo still evaluates that teacher, writes its report with a collapse
    entry and exits with status 3; tools/train.py alone stops with the monitor's error."""
    data = tmp_path / 'mine'
    data.mkdir()
    _own_folder(str(data), with_masks=True)
    uniform = ['model.teacher_temp=100', 'model.warmup_teacher_temp=100',
               'custom_hooks.1.patience=1']
    wd = tmp_path / 'wd'
    out = _demo(['--data-root', str(data), '--work-dir', str(wd), '--no-supervised', *TINY,
                 *uniform, '--seeds', '1'], status=3)
    assert 'uniform collapse of the teacher at iteration 1, pretraining stopped at' in out
    summary = json.loads((wd / 'summary.json').read_text())
    c = summary['collapse']
    assert c['kind'] == 'uniform' and c['iteration'] == 1 and c['stopped_at_iteration'] >= 1
    assert c['signals']['teacher_entropy'] > 0.99 * c['signals']['teacher_batch_entropy']
    assert 'teacher_temp' in c['what_to_change'] and osp.isfile(c['checkpoint'])
    assert summary['knn_top1']['teacher'] >= 0  # that teacher was evaluated
    report = (wd / 'report.md').read_text()
    assert '**uniform collapse**' in report and 'exits with status 3' in report
    from mmengine.config import Config
    cfg_path = str(wd / 'pretrain_config.py')
    cfg = Config.fromfile(cfg_path)
    assert 'DemoCollapseMonitorHook' in [h['type'] for h in cfg.custom_hooks]
    env = dict(os.environ, OMP_NUM_THREADS='1')
    plain = osp.join(REPO, 'configs/pretrain/dino_dinovim-demo_1xb32-14e_embedded-64px.py')
    proc = subprocess.run(
        [sys.executable, osp.join(REPO, 'tools/train.py'), plain, '--work-dir',
         str(tmp_path / 'train'), '--cfg-options', *uniform, 'train_cfg.max_epochs=1',
         'train_dataloader.batch_size=8', 'train_dataloader.num_workers=0',
         f'train_dataloader.dataset.data_root={data}',
         'train_dataloader.dataset.type=ImageFolderWithMasks', 'custom_hooks.3.interval=1000',
         f'custom_hooks.3.dataloader.dataset.data_root={data}',
         'custom_hooks.3.dataloader.dataset.type=ImageFolderWithMasks',
         'custom_hooks.3.dataloader.dataset.indices=2'],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert 'uniform collapse of the teacher' in proc.stderr
    assert not list((tmp_path / 'train').glob('collapse_iter_*.pth'))


def test_the_supervised_baseline_follows_the_dino_run(tmp_path):
    from mmengine.config import Config

    from mmdinomamba.demo.data import prepare_data
    from mmdinomamba.demo.supervised import supervised_config
    from repo_files import load_file
    demo = load_file('tools/demo.py')
    data_root = tmp_path / 'mine'
    data_root.mkdir()
    _own_folder(str(data_root))
    data = prepare_data(str(data_root), generate=False)
    dino = Config.fromfile(demo.run_config(demo.find_config('dinovim'), data,
                                           str(tmp_path / 'run'), {'train_cfg.max_epochs': 3}))
    sup = Config.fromfile(supervised_config(REPO, data, dino, str(tmp_path / 'run')))
    bb = dict(dino.model.backbone)
    bb.pop('_delete_', None)
    assert dict(sup.model.backbone) == bb  # the same network
    assert sup.model.head.num_classes == 3 == sup.data_preprocessor.num_classes
    assert sup.train_dataloader.dataset.data_root == str(data_root)
    assert sup.train_dataloader.dataset.type == 'ImageFolderWithMasks'
    assert sup.train_dataloader.batch_size == dino.train_dataloader.batch_size
    assert sup.train_cfg.max_epochs == 3 and sup.param_scheduler[1].end == 3
    resize = [s for s in sup.train_dataloader.dataset.pipeline if s['type'] == 'Resize']
    assert tuple(resize[0]['scale']) == (64, 64) and sup.val_cfg is None
    assert sup.model.head.loss.type == 'CrossEntropyLoss'
