"""A typo in the arguments of a hook, a loop or an ``init_cfg`` is an error naming it and the
closest valid keys when the config is checked, before the runner is built (mmengine's
``CheckpointHook`` forwards unknown keys to ``save_checkpoint``: the typo used to fail at the
first save, after a whole epoch)."""
import glob
import os.path as osp

import pytest
from repo_files import REPO, load_file

from mmdinomamba.utils.cfg_check import UnknownArgumentError, check_runner_args
from mmdinomamba.utils.cli import load_config

DEMO_CFG = osp.join(REPO, 'configs/pretrain/dino_dinovim-demo_1xb32-14e_embedded-64px.py')


def _cfg(options):
    return load_config(DEMO_CFG, options, allow_new_keys=True)


@pytest.mark.parametrize('options, where, key, close', [
    ({'default_hooks.checkpoint.max_keep_ckpt': 1}, 'default_hooks.checkpoint',
     'max_keep_ckpt', 'max_keep_ckpts'),
    ({'default_hooks.logger.intervl': 5}, 'default_hooks.logger', 'intervl', 'interval'),
    ({'custom_hooks.1.patince': 3}, 'custom_hooks[1] (DINOCollapseMonitorHook)', 'patince',
     'patience'),
    ({'train_cfg.max_epoch': 3}, 'train_cfg', 'max_epoch', 'max_epochs'),
    ({'model.backbone.init_cfg': dict(type='Pretrained', checkpoint='x.pth', prefx='b.')},
     'model.backbone.init_cfg', 'prefx', 'prefix'),
])
def test_a_typo_is_named_with_the_closest_keys(options, where, key, close):
    with pytest.raises(UnknownArgumentError) as err:
        check_runner_args(_cfg(options))
    assert str(err.value).startswith(f'{where}: unknown argument {key!r} of ')
    assert f'Did you mean: {close}' in str(err.value)


def test_unknown_type_and_missing_argument():
    with pytest.raises(UnknownArgumentError, match="unknown type 'AtomicCheckpointHok'.*Did "
                       'you mean: AtomicCheckpointHook'):
        check_runner_args(_cfg({'default_hooks.checkpoint.type': 'AtomicCheckpointHok'}))
    with pytest.raises(UnknownArgumentError, match=r"Pretrained.*needs the argument\(s\) "
                       r"\['checkpoint'\]"):
        check_runner_args(_cfg({'model.backbone.init_cfg': dict(type='Pretrained')}))


def test_pretrained_typo_is_named_when_the_backbone_initializes():
    from mmdinomamba.models.utils import split_pretrained_cfg
    with pytest.raises(UnknownArgumentError, match="init_cfg: unknown argument 'prefx'.*"
                       'Did you mean: prefix'):
        split_pretrained_cfg(dict(type='Pretrained', checkpoint='x.pth', prefx='teacher.'))


def test_train_stops_before_building_anything(tmp_path):
    train = load_file('tools/train.py')
    work = tmp_path / 'run'
    with pytest.raises(UnknownArgumentError, match='max_keep_ckpts'):
        train.main([DEMO_CFG, '--work-dir', str(work), '--allow-new-keys', '--cfg-options',
                    'default_hooks.checkpoint.max_keep_ckpt=1'])
    assert not work.exists()


def _has_downstream():
    try:
        import mmdet  # noqa: F401
        import mmseg  # noqa: F401
    except ImportError:
        return False
    return True


def test_the_configs_pass():
    """Every demo config and one config of every folder, resolved through their bases."""
    files = sorted(glob.glob(osp.join(REPO, 'configs/**/*.py'), recursive=True))
    leaves = [p for p in files if '/_base_/' not in p and (
        _has_downstream() or not ('/seg/' in p or '/det/' in p))]
    first = {}
    for path in leaves:
        first.setdefault(osp.dirname(path), path)
    paths = sorted(set(first.values()) | {p for p in leaves if 'demo' in osp.basename(p)})
    for path in paths:
        check_runner_args(load_config(path))
    assert len(paths) > 10
