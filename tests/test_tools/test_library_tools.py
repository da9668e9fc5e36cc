"""The libraries' own entry points run the shipped demo configs through ``custom_imports``
alone: mmpretrain's, mmseg's and mmdet's ``tools/train.py`` (from their installed packages'
``.mim/tools``) train a few iterations of one config each (DINO pretraining, linear probe,
classification, UperNet, Cascade Mask R-CNN), their ``tools/test.py`` evaluate a checkpoint, and
mmpretrain's model zoo API (``inference_model``, ``ImageClassificationInferencer``,
``FeatureExtractor``) runs the classification demo with its checkpoint."""
import glob
import importlib.util
import os
import os.path as osp
import subprocess
import sys

import pytest

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DINO = osp.join(REPO, 'configs/pretrain/dino_dinovim-demo_1xb32-14e_embedded-64px.py')
PROBE = osp.join(REPO, 'configs/linear_probe/linear-probe_dinovim-demo_embedded-64px.py')
CLS = osp.join(REPO, 'configs/classification/dinovim-demo_1xb32-5e_embedded-64px.py')
SEG = osp.join(REPO, 'configs/seg/upernet_dinovim-demo_1xb8-300i_embedded-128x128.py')
DET = osp.join(REPO, 'configs/det/cascade-mask-rcnn_dinovim-demo-simplefpn_1xb4-300i_embedded-'
               '128x128.py')
CLS_NAME = 'dinovim-demo_1xb32-5e_embedded-64px'


def library_tool(package: str, name: str) -> str:
    """``<site-packages>/<package>/.mim/tools/<name>``: the library's own script."""
    spec = importlib.util.find_spec(package)
    if spec is None:
        pytest.skip(f'{package} is not installed')
    path = osp.join(osp.dirname(spec.origin), '.mim', 'tools', name)
    assert osp.isfile(path), f'{package} ships no {path}'
    return path


def run_tool(package, name, *args, cwd):
    """Run the library's script in a fresh interpreter (this checkout importable, nothing of
    ours imported before the config is read); returns its output."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [REPO] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]))
    proc = subprocess.run([sys.executable, library_tool(package, name), *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    return out


def _roots(root, *loaders):
    return [f'{loader}.dataset.data_root={root}' for loader in loaders]


@pytest.fixture(scope='module')
def classifier_checkpoint(embedded_root, tmp_path_factory):
    """mmpretrain's tools/train.py: the classification demo, two epochs (4 iterations)."""
    work = tmp_path_factory.mktemp('cls')
    run_tool('mmpretrain', 'train.py', CLS, '--work-dir', str(work), '--cfg-options',
             *_roots(embedded_root, 'train_dataloader', 'val_dataloader', 'test_dataloader'),
             'train_cfg.max_epochs=2', cwd=work)  # epoch 1 is the warm-up
    return work / 'epoch_2.pth'


def test_mmpretrain_tools_pretrain_then_linear_probe(embedded_root, tmp_path):
    """DINO pretraining (3 iterations + its Binary-AUC evaluation), then the linear probe of its
    teacher backbone, then mmpretrain's test.py on the probe's checkpoint."""
    dino = tmp_path / 'dino'
    log = run_tool('mmpretrain', 'train.py', DINO, '--work-dir', str(dino), '--cfg-options',
                   *_roots(embedded_root, 'train_dataloader', 'custom_hooks.3.dataloader'),
                   'custom_hooks.3.dataloader.dataset.indices=8', 'train_dataloader.batch_size=16',
                   'train_dataloader.num_workers=0', 'train_cfg.max_epochs=1', cwd=tmp_path)
    assert 'binary_auc/auc' in log
    probe = tmp_path / 'probe'
    run_tool('mmpretrain', 'train.py', PROBE, '--work-dir', str(probe), '--cfg-options',
             *_roots(embedded_root, 'train_dataloader', 'val_dataloader', 'test_dataloader'),
             f'model.backbone.init_cfg.checkpoint={dino / "epoch_1.pth"}',
             'train_cfg.max_epochs=1', 'train_cfg.val_interval=1',
             'default_hooks.checkpoint.interval=1', cwd=tmp_path)
    log = run_tool('mmpretrain', 'test.py', PROBE, str(probe / 'epoch_1.pth'), '--work-dir',
                   str(tmp_path / 'probe_test'), '--cfg-options',
                   *_roots(embedded_root, 'test_dataloader'), cwd=tmp_path)
    assert 'accuracy/top1' in log


def test_mmpretrain_tools_classification(classifier_checkpoint, embedded_root, tmp_path):
    assert classifier_checkpoint.is_file()
    log = run_tool('mmpretrain', 'test.py', CLS, str(classifier_checkpoint), '--work-dir',
                   str(tmp_path), '--cfg-options', *_roots(embedded_root, 'test_dataloader'),
                   cwd=tmp_path)
    assert 'accuracy/top1' in log


def test_model_zoo_inference_with_a_checkpoint(classifier_checkpoint, embedded_root):
    from mmpretrain import (FeatureExtractor, ImageClassificationInferencer, inference_model,
                            list_models)
    assert CLS_NAME in list_models('*dinovim*')
    img = sorted(glob.glob(str(embedded_root / 'val' / '*' / '*.png')))[0]
    result = inference_model(CLS_NAME, img, pretrained=str(classifier_checkpoint))
    classes = (embedded_root / 'classes.txt').read_text().split()
    assert result['pred_class'] in classes and 0 <= result['pred_score'] <= 1
    inferencer = ImageClassificationInferencer(CLS_NAME, pretrained=str(classifier_checkpoint))
    again = inferencer(img)[0]
    assert again['pred_label'] == result['pred_label']
    feats = FeatureExtractor(CLS_NAME, pretrained=str(classifier_checkpoint))(img)[0]
    assert feats[-1].shape[-1] == 64  # the demo backbone's width


def test_mmseg_tools_train_and_test(embedded_root, tmp_path):
    work = tmp_path / 'seg'
    run_tool('mmseg', 'train.py', SEG, '--work-dir', str(work), '--cfg-options',
             *_roots(embedded_root, 'train_dataloader', 'val_dataloader', 'test_dataloader'),
             'train_cfg.max_iters=2', 'train_cfg.val_interval=2',
             'default_hooks.checkpoint.interval=2', 'default_hooks.logger.interval=1', cwd=tmp_path)
    log = run_tool('mmseg', 'test.py', SEG, str(work / 'iter_2.pth'), '--work-dir',
                   str(tmp_path / 'seg_test'), '--cfg-options',
                   *_roots(embedded_root, 'test_dataloader'), cwd=tmp_path)
    assert 'mIoU' in log


def test_mmdet_tools_train_and_test(embedded_root, tmp_path):
    work = tmp_path / 'det'
    ann = [f'{key}.ann_file={embedded_root}/coco/annotations/instances_val.json'
           for key in ('val_evaluator', 'test_evaluator')]
    log = run_tool('mmdet', 'train.py', DET, '--work-dir', str(work), '--cfg-options',
                   *_roots(embedded_root, 'train_dataloader', 'val_dataloader',
                           'test_dataloader'), *ann,
                   'train_cfg.max_iters=2', 'train_cfg.val_interval=100',
                   'default_hooks.checkpoint.interval=2', 'default_hooks.logger.interval=1',
                   cwd=tmp_path)
    assert (work / 'iter_2.pth').is_file(), log[-2000:]
    log = run_tool('mmdet', 'test.py', DET, str(work / 'iter_2.pth'), '--work-dir',
                   str(tmp_path / 'det_test'), '--cfg-options',
                   *_roots(embedded_root, 'test_dataloader'), *ann[1:], cwd=tmp_path)
    assert 'coco/bbox_mAP' in log, log[-2000:]
