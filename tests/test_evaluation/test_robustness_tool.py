"""tools/analysis/eval_robustness.py end to end on tiny fake test sets with a probe whose
predictions are fixed by its head bias (so every accuracy is known in advance)."""
import json
import os
import os.path as osp

import numpy as np
import torch
from mmpretrain.registry import MODELS
from PIL import Image

from mmdinomamba.datasets.imagenet_wnids import IMAGENET_A_WNIDS
from repo_files import load_file

CONFIG = """
custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)
model = dict(
    type='LinearProbe',
    backbone=dict(type='ViT', arch=dict(embed_dims=16, num_layers=1, num_heads=2),
                  img_size=224, patch_size=32),
    num_blocks=1,
    head=dict(type='LinearClsHead', num_classes=1000, loss=dict(type='CrossEntropyLoss')))
data_preprocessor = dict(num_classes=1000, mean=[123.675, 116.28, 103.53],
                         std=[58.395, 57.12, 57.375], to_rgb=True)
"""


def _tool():
    return load_file('tools/analysis/eval_robustness.py')


def _img(path):
    os.makedirs(osp.dirname(path), exist_ok=True)
    Image.fromarray(np.full((12, 10, 3), 90, np.uint8)).save(path)


def _probe(tmp_path):
    cfg_path = tmp_path / 'probe.py'
    cfg_path.write_text(CONFIG)
    model = MODELS.build(dict(type='LinearProbe', backbone=dict(
        type='ViT', arch=dict(embed_dims=16, num_layers=1, num_heads=2), img_size=224,
        patch_size=32), num_blocks=1, head=dict(type='LinearClsHead', num_classes=1000)))
    with torch.no_grad():  # always predict class 0 (not an ImageNet-A class); then 1, 2, ...
        model.head.fc.weight.zero_()
        model.head.fc.bias.copy_(-torch.arange(1000.) * 1e-3)
        model.head.fc.bias[0] = 1.
    ckpt = tmp_path / 'probe.pth'
    torch.save(dict(state_dict=model.state_dict(), meta=dict()), ckpt)
    return str(cfg_path), str(ckpt)


def _fake_sets(root):
    for cls, n in (('0', 2), ('1', 1)):  # ImageNet-V2 layout: 2 of 3 images are class 0
        for i in range(n):
            _img(str(root / 'v2' / cls / f'{i}.jpeg'))
    # ImageNet-A: restricted to A, the prediction is A's smallest index (n01498041 = A[0])
    _img(str(root / 'a' / IMAGENET_A_WNIDS[0] / 'x.jpg'))
    for i in range(2):
        _img(str(root / 'a' / IMAGENET_A_WNIDS[1] / f'{i}.jpg'))
    (root / 'a' / 'README.txt').write_text('not a class')
    # ReaL (flat val + meta/val.txt): labels sets [0], [5, 0], [] (excluded), [7] -> 2 of 3
    lines = []
    for num, label in ((1, 0), (2, 5), (3, 1), (4, 7)):
        name = f'ILSVRC2012_val_{num:08d}.JPEG'
        _img(str(root / 'inet' / 'val' / name))
        lines.append(f'{name} {label}')
    os.makedirs(root / 'inet' / 'meta')
    (root / 'inet' / 'meta' / 'val.txt').write_text('\n'.join(lines) + '\n')
    (root / 'inet' / 'real.json').write_text(json.dumps([[0], [5, 0], [], [7]]))


def test_eval_robustness_prints_table_row_and_writes_json(tmp_path, capsys):
    cfg, ckpt = _probe(tmp_path)
    _fake_sets(tmp_path)
    missing = str(tmp_path / 'missing')
    out = tmp_path / 'rob.json'
    argv = [cfg, ckpt, '--data-root-v2-mf', str(tmp_path / 'v2'), '--data-root-a',
            str(tmp_path / 'a'), '--data-root-real', str(tmp_path / 'inet'), '--num-workers',
            '0', '--batch-size', '2', '--device', 'cpu', '--out', str(out), '--name', 'Tiny']
    for key in ('v2-t07', 'v2-ti', 'sketch', 'r'):
        argv += [f'--data-root-{key}', missing]
    report = _tool().main(argv)
    printed = capsys.readouterr().out
    assert '| Model | V2 MF | V2 T0.7 | V2 TI | Sketch | A | R | ReaL |' in printed
    assert '| Tiny | 66.7 | - | - | - | 33.3 | - | 66.7 |' in printed
    assert f'skip Sketch: folder {missing} not found' in printed
    saved = json.loads(out.read_text())
    assert saved['results']['a']['restricted/top1'] == report['results']['a']['restricted/top1']
    assert saved['results']['real']['real/num_excluded'] == 1
    assert saved['results']['v2-mf']['num_samples'] == 3
    assert set(saved['skipped']) == {'v2-t07', 'v2-ti', 'sketch', 'r'}


def test_missing_real_json_is_skipped(tmp_path, capsys):
    cfg, ckpt = _probe(tmp_path)
    os.makedirs(tmp_path / 'inet')
    argv = [cfg, ckpt, '--num-workers', '0', '--device', 'cpu', '--out',
            str(tmp_path / 'o.json'), '--data-root-real', str(tmp_path / 'inet')]
    for key in ('v2-mf', 'v2-t07', 'v2-ti', 'sketch', 'a', 'r'):
        argv += [f'--data-root-{key}', str(tmp_path / 'missing')]
    report = _tool().main(argv)
    assert report['results'] == {} and 'real.json not found' in report['skipped']['real']
    assert '| probe | - | - | - | - | - | - | - |' in capsys.readouterr().out
