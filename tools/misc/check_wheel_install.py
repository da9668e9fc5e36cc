"""Build a wheel of this checkout and use it as a user of the installed package would.

Steps (nothing is downloaded; the environment this runs in is only read):

1. ``pip wheel --no-deps --no-build-isolation <repo>`` into ``WORK/dist``;
2. a new virtualenv ``WORK/venv`` whose ``site-packages`` also sees this environment's
   packages (a ``.pth`` line: torch, the OpenMMLab stack, ...), and the wheel installed into it
   with pip (``--no-deps --no-index --ignore-installed``: no editable install, nothing of this
   environment replaced);
3. from ``WORK/elsewhere`` (no checkout on the path): the package and its ``.mim`` folder come
   from the wheel, configs are listed and loaded through ``mmdinomamba::`` bases, the data tool
   of ``.mim/tools`` writes a small embedded data set, and ``.mim/tools/train.py`` trains a user
   config that inherits ``mmdinomamba::pretrain/dino_dinovim-demo_...`` for a few iterations.

Example:
    python tools/misc/check_wheel_install.py --work-dir /path/to/scratch
"""
import argparse
import glob
import os
import os.path as osp
import site
import subprocess
import sys
import sysconfig
import tempfile
import time

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DEMO = 'pretrain/dino_dinovim-demo_1xb32-14e_embedded-64px.py'

CHECK = r'''
import glob, os, os.path as osp, sys
import mmdinomamba
from mmengine.config import Config
from mmengine.utils import get_installed_path
pkg = get_installed_path('mmdinomamba')
assert osp.samefile(pkg, osp.dirname(mmdinomamba.__file__)), pkg
assert 'site-packages' in pkg and not osp.islink(osp.join(pkg, '.mim', 'configs')), pkg
configs = sorted(osp.relpath(p, osp.join(pkg, '.mim', 'configs')) for p in
                 glob.glob(osp.join(pkg, '.mim', 'configs', '*', '*.py')))
print(f'{len(configs)} configs in {pkg}/.mim/configs')
for rel in configs:
    with open('probe_cfg.py', 'w') as f:
        f.write(f"_base_ = 'mmdinomamba::{rel}'\n")
    Config.fromfile('probe_cfg.py', import_custom_modules=False)
print(f'all {len(configs)} load as mmdinomamba:: bases')
from mmpretrain import list_models
print('list_models(*dinovim*):', len(list_models('*dinovim*')))
'''

USER_CFG = """_base_ = 'mmdinomamba::{demo}'
data_root = '{data}'
train_dataloader = dict(batch_size=16, num_workers=0, dataset=dict(data_root=data_root))
train_cfg = dict(max_epochs=1)
custom_hooks = [dict(type='DINOTeacherHook'), dict(type='EpochSeedHook')]
"""


def run(cmd, **kwargs):
    print('+', ' '.join('<script>' if '\n' in c else c for c in cmd), flush=True)
    subprocess.run(cmd, check=True, **kwargs)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--work-dir', help='scratch folder (default: a new temporary one)')
    args = parser.parse_args(argv)
    work = osp.abspath(args.work_dir or tempfile.mkdtemp(prefix='mmdm-wheel-'))
    os.makedirs(work, exist_ok=True)
    if os.listdir(work):
        raise SystemExit(f'--work-dir {work} is not empty; give a new or empty folder')
    start = time.time()
    run([sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps', '--no-build-isolation', REPO,
         '-w', osp.join(work, 'dist')])
    wheel, = glob.glob(osp.join(work, 'dist', 'mmdinomamba-*.whl'))
    venv = osp.join(work, 'venv')
    run([sys.executable, '-m', 'venv', '--without-pip', venv])
    python = osp.join(venv, 'bin', 'python')
    purelib = subprocess.run([python, '-c', 'import sysconfig; print(sysconfig.get_paths()'
                              '["purelib"])'], check=True, capture_output=True,
                             text=True).stdout.strip()
    shared = [p for p in site.getsitepackages() + [sysconfig.get_paths()['purelib']]
              if osp.isdir(p)]
    with open(osp.join(purelib, 'shared_environment.pth'), 'w') as f:
        f.write('\n'.join(dict.fromkeys(shared)) + '\n')
    run([python, '-m', 'pip', 'install', '-q', '--no-deps', '--no-index', '--ignore-installed',
         wheel])
    elsewhere = osp.join(work, 'elsewhere')
    os.makedirs(elsewhere)
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    run([python, '-c', CHECK], cwd=elsewhere, env=env)
    tools = osp.join(purelib, 'mmdinomamba', '.mim', 'tools')
    data = osp.join(elsewhere, 'data', 'embedded')
    run([python, osp.join(tools, 'misc', 'make_embedded_data.py'), '--root', data,
         '--num-train', '48', '--num-val', '16'], cwd=elsewhere, env=env)
    with open(osp.join(elsewhere, 'my_dino.py'), 'w') as f:
        f.write(USER_CFG.format(demo=DEMO, data=data))
    run([python, osp.join(tools, 'train.py'), 'my_dino.py', '--work-dir', 'work'],
        cwd=elsewhere, env=env)
    ckpt = osp.join(elsewhere, 'work', 'epoch_1.pth')
    if not osp.isfile(ckpt):
        raise SystemExit(f'training from the wheel wrote no {ckpt}')
    print(f'wheel check passed in {time.time() - start:.0f} s: {wheel} -> {ckpt}')


if __name__ == '__main__':
    main()
