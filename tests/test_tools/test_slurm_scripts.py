"""``tools/slurm_train.sh`` / ``slurm_test.sh`` against a fake ``srun`` on PATH that records the
arguments and the environment it is started with (no Slurm, no GPU needed)."""
import json
import os
import os.path as osp
import stat
import subprocess
import sys

import pytest

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

FAKE_SRUN = """#!{python}
import json, os, sys
with open(os.environ['FAKE_SRUN_LOG'], 'w') as f:
    json.dump(dict(argv=sys.argv[1:], pythonpath=os.environ.get('PYTHONPATH', '')), f)
"""


def _launch(tmp_path, script, args, **env):
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir(exist_ok=True)
    srun = bin_dir / 'srun'
    srun.write_text(FAKE_SRUN.format(python=sys.executable))
    srun.chmod(srun.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / 'srun.json'
    full_env = {k: v for k, v in os.environ.items()
                if k not in ('GPUS', 'GPUS_PER_NODE', 'CPUS_PER_TASK', 'SRUN_ARGS', 'PYTHON')}
    full_env.update(PATH=f'{bin_dir}{os.pathsep}{os.environ["PATH"]}', FAKE_SRUN_LOG=str(log),
                    **env)
    proc = subprocess.run(['bash', osp.join(REPO, 'tools', script), *args], cwd=tmp_path,
                          env=full_env, capture_output=True, text=True, timeout=60)
    return proc, (json.loads(log.read_text()) if log.exists() else None)


def _split(argv, python='python'):
    """srun's own options and the command it is asked to run (from the Python on)."""
    start = argv.index(python)
    return argv[:start], argv[start:]


def test_slurm_train_defaults_and_pass_through(tmp_path):
    proc, rec = _launch(tmp_path, 'slurm_train.sh',
                        ['gpu-part', 'dino-b', 'configs/x.py', 'work_dirs/x', '--resume',
                         '--cfg-options', 'train_cfg.max_epochs=2', 'a=has space'])
    assert proc.returncode == 0, proc.stderr
    opts, cmd = _split(rec['argv'])
    assert opts == ['-p', 'gpu-part', '--job-name=dino-b', '--gres=gpu:8', '--ntasks=8',
                    '--ntasks-per-node=8', '--cpus-per-task=5', '--kill-on-bad-exit=1']
    assert cmd == ['python', '-u', osp.join(REPO, 'tools', 'train.py'), 'configs/x.py',
                   '--work-dir=work_dirs/x', '--launcher=slurm', '--resume', '--cfg-options',
                   'train_cfg.max_epochs=2', 'a=has space']
    assert rec['pythonpath'].split(os.pathsep)[0] == REPO


def test_slurm_train_environment_settings(tmp_path):
    proc, rec = _launch(tmp_path, 'slurm_train.sh', ['p', 'j', 'c.py', 'w'], GPUS='16',
                        GPUS_PER_NODE='4', CPUS_PER_TASK='2',
                        SRUN_ARGS='--quotatype=auto --time=10', PYTHON='/opt/py/bin/python')
    assert proc.returncode == 0, proc.stderr
    argv = rec['argv']
    for opt in ('--gres=gpu:4', '--ntasks=16', '--ntasks-per-node=4', '--cpus-per-task=2',
                '--quotatype=auto', '--time=10'):
        assert opt in argv
    assert argv.index('--time=10') < argv.index('/opt/py/bin/python')


def test_slurm_train_fewer_gpus_than_a_node(tmp_path):
    _, rec = _launch(tmp_path, 'slurm_train.sh', ['p', 'j', 'c.py', 'w'], GPUS='2')
    assert '--ntasks=2' in rec['argv'] and '--ntasks-per-node=2' in rec['argv']
    assert '--gres=gpu:2' in rec['argv']


def test_slurm_test_command(tmp_path):
    proc, rec = _launch(tmp_path, 'slurm_test.sh',
                        ['p', 'eval', 'c.py', 'ckpt.pth', '--out', 'm.json'], GPUS='1')
    assert proc.returncode == 0, proc.stderr
    _, cmd = _split(rec['argv'])
    assert cmd == ['python', '-u', osp.join(REPO, 'tools', 'test.py'), 'c.py', 'ckpt.pth',
                   '--launcher=slurm', '--out', 'm.json']


@pytest.mark.parametrize('script', ['slurm_train.sh', 'slurm_test.sh'])
def test_slurm_usage_error(tmp_path, script):
    proc, rec = _launch(tmp_path, script, ['p', 'j', 'c.py'])
    assert proc.returncode == 2 and 'usage:' in proc.stderr
    assert rec is None  # srun never started


def test_launched_command_parses(tmp_path):
    """The command line srun gets is one that tools/train.py accepts."""
    _, rec = _launch(tmp_path, 'slurm_train.sh', ['p', 'j', 'c.py', 'w', '--amp'])
    _, cmd = _split(rec['argv'])
    from repo_files import load_file
    args = load_file('tools/train.py').parse_args(cmd[3:])
    assert (args.config, args.work_dir, args.launcher, args.amp) == ('c.py', 'w', 'slurm', True)
