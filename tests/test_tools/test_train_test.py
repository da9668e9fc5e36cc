"""tools/train.py and tools/test.py on the embedded data: train, resume, evaluate, clear errors."""
import logging
import os
import os.path as osp
import shutil

import pytest
import torch
from repo_files import load_file

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIG = osp.join(ROOT, 'configs/classification/dinovim-demo_1xb32-5e_embedded-64px.py')


def _tool(name):
    return load_file(f'tools/{name}.py')


def _opts(root, epochs):
    return ['--cfg-options', f'train_dataloader.dataset.data_root={root}',
            f'val_dataloader.dataset.data_root={root}', f'test_dataloader.dataset.data_root={root}',
            f'train_cfg.max_epochs={epochs}', 'train_dataloader.batch_size=16',
            'default_hooks.checkpoint.max_keep_ckpts=5', 'randomness.deterministic=True']


def _weights(path):
    from mmengine.runner import CheckpointLoader
    return CheckpointLoader.load_checkpoint(path, map_location='cpu')


@pytest.mark.slow
def test_train_resume_and_test(embedded_root, tmp_path):
    train, test = _tool('train'), _tool('test')
    full, part = str(tmp_path / 'full'), str(tmp_path / 'part')
    train.main([CONFIG, '--work-dir', full, *_opts(embedded_root, 3)])
    assert {f'epoch_{i}.pth' for i in (1, 2, 3)} <= set(map(osp.basename, _ls(full)))
    # an interrupted run: only the epoch-2 checkpoint survives; --resume continues from it
    os.makedirs(part)
    shutil.copy(osp.join(full, 'epoch_2.pth'), part)
    train.main([CONFIG, '--work-dir', part, '--resume', osp.join(part, 'epoch_2.pth'),
                *_opts(embedded_root, 3)])
    assert not osp.exists(osp.join(part, 'epoch_1.pth'))
    a, b = _weights(osp.join(full, 'epoch_3.pth')), _weights(osp.join(part, 'epoch_3.pth'))
    assert b['meta']['epoch'] == 3 and b['meta']['iter'] == a['meta']['iter']
    for k, v in a['state_dict'].items():  # resumed == uninterrupted (same seed, CPU)
        torch.testing.assert_close(b['state_dict'][k], v, rtol=1e-5, atol=1e-6, msg=k)
    out = str(tmp_path / 'metrics.json')
    metrics = test.main([CONFIG, osp.join(full, 'epoch_3.pth'), '--work-dir', str(tmp_path / 't'),
                         '--out', out, *_opts(embedded_root, 3)])
    assert 0 <= metrics['accuracy/top1'] <= 100 and osp.isfile(out)


def _ls(folder):
    import glob
    return glob.glob(osp.join(folder, '*.pth'))


def test_unknown_config_key_is_named(tmp_path):
    train = _tool('train')
    match = r"train_cfg\.max_epoch'.*Did you mean: train_cfg\.max_epochs"
    with pytest.raises(KeyError, match=match):
        train.main([CONFIG, '--work-dir', str(tmp_path), '--cfg-options', 'train_cfg.max_epoch=1'])


def test_missing_data_root_is_named(tmp_path):
    from mmdinomamba.utils.cli import check_data_roots, load_config
    cfg = load_config(osp.join(ROOT, 'configs/_base_/datasets/imagenet_s_binary_auc.py'))
    cfg.test_dataloader.dataset.data_root = str(tmp_path / 'no_such_folder')
    with pytest.raises(FileNotFoundError, match='no_such_folder'):
        check_data_roots(cfg)
    with pytest.raises(FileNotFoundError, match='missing.py'):
        _tool('train').main([str(tmp_path / 'missing.py')])


def test_missing_resume_checkpoint_is_named(tmp_path, embedded_root):
    with pytest.raises(FileNotFoundError, match='nope.pth'):
        _tool('train').main([CONFIG, '--work-dir', str(tmp_path), '--resume',
                             str(tmp_path / 'nope.pth'), *_opts(embedded_root, 1)])


def test_corrupt_image_is_named(embedded_root, tmp_path):
    from mmpretrain.registry import DATASETS
    root = tmp_path / 'emb'
    shutil.copytree(embedded_root, root)
    bad = sorted((root / 'train').rglob('*.png'))[0]
    bad.write_bytes(b'not a png')
    ds = DATASETS.build(dict(type='EmbeddedShapes', data_root=str(root), split='train',
                             pipeline=[dict(type='LoadImageFromFile')]))
    idx = [i for i in range(len(ds)) if ds.get_data_info(i)['img_path'] == str(bad)][0]
    with pytest.raises(Exception, match=bad.name):
        ds[idx]


def test_resume_with_nothing_to_resume_says_so(tmp_path, monkeypatch):
    train = _tool('train')
    logged = []
    monkeypatch.setattr(train, 'print_log', lambda msg, **kw: logged.append((msg, kw)))
    work = tmp_path / 'empty run'
    work.mkdir()
    (work / 'epoch_3.pth').write_bytes(b'')
    cfg = train.merge_args(train.load_config(CONFIG),
                           train.parse_args([CONFIG, '--work-dir', str(work), '--resume']))
    assert cfg.resume and cfg.load_from is None
    (msg, kw), = logged
    assert str(work) in msg and 'from scratch' in msg and 'epoch_3.pth' in msg
    assert kw['level'] == logging.WARNING
    (work / 'last_checkpoint').write_text(str(work / 'epoch_2.pth'))
    with pytest.raises(FileNotFoundError, match=r'last_checkpoint names .*epoch_2\.pth'):
        train.merge_args(train.load_config(CONFIG),
                         train.parse_args([CONFIG, '--work-dir', str(work), '--resume']))
    (work / 'last_checkpoint').write_text(str(work / 'epoch_3.pth'))
    cfg = train.merge_args(train.load_config(CONFIG),
                           train.parse_args([CONFIG, '--work-dir', str(work), '--resume']))
    assert cfg.load_from == str(work / 'epoch_3.pth')


@pytest.mark.parametrize('out, error, match', [
    ('metrics.txt', ValueError, r'must end with \.json or \.pkl'),
    ('missing/metrics.json', FileNotFoundError, r'the folder .*missing does not exist'),
    ('.', ValueError, 'must end with'),
])
def test_out_is_checked_before_the_evaluation(tmp_path, monkeypatch, out, error, match):
    test = _tool('test')

    class NoRunner:
        @staticmethod
        def from_cfg(cfg):
            raise AssertionError('the evaluation started')

    monkeypatch.setattr(test, 'Runner', NoRunner)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error, match=match):
        test.main([CONFIG, '--work-dir', str(tmp_path), '--out', out])


@pytest.mark.skipif(os.geteuid() == 0, reason='root may write anywhere')
def test_out_in_a_read_only_folder_is_refused(tmp_path):
    from mmdinomamba.utils.cli import check_out_path
    (tmp_path / 'ro').mkdir(mode=0o555)
    with pytest.raises(PermissionError, match='not writable'):
        check_out_path(str(tmp_path / 'ro' / 'm.json'))


def test_nan_metrics_are_written_as_json_null(embedded_root, tmp_path):
    """Every mask all foreground: Binary-AUC is NaN; --out stays valid JSON (null)."""
    import json
    import numpy as np
    from PIL import Image
    root = tmp_path / 'emb'
    shutil.copytree(embedded_root, root)
    for mask in (root / 'masks' / 'val').rglob('*.png'):
        Image.fromarray(np.full((64, 64), 255, np.uint8)).save(mask)
    out = tmp_path / 'auc.json'
    data = 'test_dataloader.dataset.'
    metrics = _tool('test').main([
        osp.join(ROOT, 'configs/analysis/binary-auc_dinovim-demo_embedded.py'), '--work-dir',
        str(tmp_path / 'work'), '--out', str(out), '--cfg-options', f'{data}data_root={root}',
        'model.backbone.arch.num_layers=1', 'test_dataloader.batch_size=16'])
    assert np.isnan(metrics['binary_auc/auc'])

    def no_nan(name):
        raise ValueError(f'not JSON: {name}')

    saved = json.loads(out.read_text(), parse_constant=no_nan)
    assert saved['binary_auc/auc'] is None and saved['binary_auc/skipped'] == 16
    assert not [f for f in os.listdir(tmp_path) if f.startswith('.')]  # no scratch file left
