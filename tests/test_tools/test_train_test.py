"""tools/train.py and tools/test.py on the embedded data: train, resume, evaluate, clear errors."""
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
    import os
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
