"""The ImageNet mean / std: one definition in code (``datasets/normalization.py``); the configs,
which cannot import it, repeat the same numbers."""
import ast
import glob
import os.path as osp

import pytest

from mmdinomamba.datasets.normalization import (IMAGENET_MEAN, IMAGENET_STD,
                                                imagenet_preprocessor)

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIGS = sorted(glob.glob(osp.join(REPO, 'configs', '**', '*.py'), recursive=True))


def _normalization_values(path):
    """Every ``mean=[...]`` / ``std=[...]`` keyword of three numbers in a config file."""
    found = []
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.keyword) and node.arg in ('mean', 'std'):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                continue
            if isinstance(value, (list, tuple)) and len(value) == 3:
                found.append((node.arg, tuple(value)))
    return found


@pytest.mark.parametrize('path', CONFIGS, ids=lambda p: osp.relpath(p, REPO))
def test_configs_repeat_the_one_normalization(path):
    for key, value in _normalization_values(path):
        assert value == (IMAGENET_MEAN if key == 'mean' else IMAGENET_STD), (path, key, value)


def test_some_configs_normalize():
    assert sum(bool(_normalization_values(p)) for p in CONFIGS) >= 4


def test_preprocessor_config():
    cfg = imagenet_preprocessor(num_classes=5)
    assert cfg == dict(type='ClsDataPreprocessor', mean=list(IMAGENET_MEAN),
                       std=list(IMAGENET_STD), to_rgb=True, num_classes=5)
