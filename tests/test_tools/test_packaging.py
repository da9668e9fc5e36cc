"""OpenMMLab packaging: ``mmdinomamba/.mim/{configs,tools,model-index.yml}`` exist in the
checkout (links to the top-level folders), the wheel's ``build_py`` writes them as plain files
next to the package data, and ``mmdinomamba::`` config bases resolve through them."""
import os
import os.path as osp
import subprocess
import sys

from mmengine.config import Config

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
MIM_ITEMS = ('configs', 'tools', 'model-index.yml')

def test_mim_folder_of_the_checkout():
    import mmdinomamba
    from mmdinomamba.utils.model_index import mim_dir
    mim = osp.join(osp.dirname(mmdinomamba.__file__), '.mim')
    for item in MIM_ITEMS:
        assert osp.realpath(osp.join(mim, item)) == osp.join(REPO, item)
    assert mim_dir() == osp.realpath(mim)


def test_build_py_ships_configs_tools_and_index(tmp_path):
    before = subprocess.run(['git', 'status', '--porcelain', '--ignored'], cwd=REPO,
                            capture_output=True, text=True).stdout
    # build_py of setup.py alone (what `pip wheel .` packs) into tmp_path
    proc = subprocess.run([sys.executable, 'setup.py', '-q', 'build_py', '--build-lib',
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    mim = tmp_path / 'mmdinomamba' / '.mim'
    assert not mim.is_symlink() and mim.is_dir()
    for item in MIM_ITEMS:
        assert not (mim / item).is_symlink(), item
    files = {osp.relpath(osp.join(d, f), mim) for d, _, fs in os.walk(mim) for f in fs}
    for rel in ('model-index.yml', 'configs/seg/upernet_dinovim-demo_1xb8-300i_embedded-128x128.py',
                'configs/seg/_base_/upernet_vit-mln.py', 'configs/pretrain/metafile.yml',
                'tools/train.py', 'tools/test.py', 'tools/slurm_train.sh',
                'tools/misc/make_embedded_data.py'):
        assert rel in files, rel
    configs = {f for f in files if f.startswith('configs/')}
    shipped = {osp.relpath(osp.join(d, f), REPO) for d, _, fs in os.walk(osp.join(REPO, 'configs'))
               for f in fs if '__pycache__' not in d}
    assert configs == shipped
    assert not any('__pycache__' in f or f.endswith('.pyc') for f in files)
    assert (tmp_path / 'mmdinomamba' / 'ops' / 'cpu' / 'csrc').is_dir()  # the kernels' sources too
    after = subprocess.run(['git', 'status', '--porcelain', '--ignored'], cwd=REPO,
                           capture_output=True, text=True).stdout
    assert after == before  # nothing written into the checkout


def test_package_scope_bases(tmp_path):
    """A user config elsewhere inherits ours by ``mmdinomamba::`` (the package imported)."""
    user = tmp_path / 'my_upernet.py'
    user.write_text("_base_ = ['mmdinomamba::seg/upernet_dinovim-demo_1xb8-300i_embedded-"
                    "128x128.py']\nmodel = dict(decode_head=dict(num_classes=3))\n")
    cfg = Config.fromfile(str(user))
    assert cfg.model.backbone.type == 'mmpretrain.DinoVim'
    assert cfg.model.decode_head.num_classes == 3 and cfg.default_scope == 'mmseg'
    user.write_text("_base_ = 'mmdinomamba::pretrain/dino_dinovim-demo_1xb32-14e_embedded-64px.py'"
                    "\ntrain_cfg = dict(max_epochs=1)\n")
    cfg = Config.fromfile(str(user))
    assert cfg.model.type == 'DINO' and cfg.train_cfg.max_epochs == 1


def test_package_scope_bases_build_in_the_default_scope(tmp_path):
    """mmengine marks a ``mmdinomamba::`` base's dicts with that scope, which has no registries;
    ``load_config`` (our tools) drops the marks, so the models build under default_scope."""
    from mmengine.registry import MODELS, DefaultScope

    from mmdinomamba.utils.cli import load_config
    user = tmp_path / 'my_cfg.py'
    for base, kind in (
            ('seg/upernet_dinovim-demo_1xb8-300i_embedded-128x128.py', 'EncoderDecoder'),
            ('classification/dinovim-demo_1xb32-5e_embedded-64px.py', 'ImageClassifier')):
        user.write_text(f"_base_ = 'mmdinomamba::{base}'\n")
        assert Config.fromfile(str(user)).model._scope_ == 'mmdinomamba'
        cfg = load_config(str(user))
        assert '_scope_' not in cfg.model
        with DefaultScope.overwrite_default_scope(cfg.default_scope):
            assert type(MODELS.build(cfg.model)).__name__ == kind
