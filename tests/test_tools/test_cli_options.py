"""``--cfg-options`` keeps values as given (mmengine's parser deletes every space in a value)."""
import argparse
import os.path as osp
import shutil

import pytest
from mmengine.config import DictAction as MMEngineDictAction
from repo_files import load_file

from mmdinomamba.utils.cli import DictAction, load_config

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIG = osp.join(REPO, 'configs/pretrain/dino_dinovim-demo_1xb32-14e_embedded-64px.py')


def _parse(action, *values):
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=action)
    return parser.parse_args(['--cfg-options', *values]).cfg_options


@pytest.mark.parametrize('value, expected', [
    ('/data/my set/x', '/data/my set/x'),
    ('[a b, c]', ['a b', 'c']),
    ('(1, my  file.png)', (1, 'my  file.png')),
    ("'1,2'", '1,2'),  # quoted: a string as it is
    ('[a, [b c, d]]', ['a', ['b c', 'd']]),
])
def test_spaces_and_quotes_are_kept(value, expected):
    assert _parse(DictAction, f'k={value}') == dict(k=expected)


@pytest.mark.parametrize('value', [
    '1', '1.5', 'True', 'false', 'None', 'x', '1,2', '[1,2]', '(1,2)', '[(1,2),[a,b],c]', '[]',
    'a,', '', '[1, 2]'
])
def test_values_without_spaces_parse_as_in_mmengine(value):
    assert _parse(DictAction, f'k={value}') == _parse(MMEngineDictAction, f'k={value}')


def test_unbalanced_brackets_are_named():
    with pytest.raises(ValueError, match=r"unbalanced brackets in '\[a,b'"):
        _parse(DictAction, 'k=[[a,b]')


@pytest.mark.parametrize('tool', ['train', 'test'])
def test_tools_keep_a_data_root_with_a_space(tool, embedded_root, tmp_path):
    """The data set in 'my data' is found (not a new one generated in 'mydata')."""
    root = tmp_path / 'my data'
    shutil.copytree(embedded_root, root)
    key = 'train_dataloader' if tool == 'train' else 'test_dataloader'
    args = load_file(f'tools/{tool}.py').parse_args(
        [CONFIG, '--cfg-options', f'{key}.dataset.data_root={root}',
         f'{key}.dataset.generate=False', '--allow-new-keys'])
    assert args.cfg_options[f'{key}.dataset.data_root'] == str(root)
    if tool == 'test':
        return  # the demo config has no test set; the parsing is what differs
    cfg = load_config(CONFIG, args.cfg_options, allow_new_keys=True)
    from mmpretrain.registry import DATASETS
    ds = DATASETS.build(cfg.train_dataloader.dataset)
    assert len(ds) == 48 and ds.data_root == str(root)
