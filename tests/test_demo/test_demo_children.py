"""``kill`` (SIGTERM) on ``tools/demo.py`` while it pretrains leaves no process of its tree
alive (its ``tools/train.py`` child used to train on unseen), and a second demo in the same
work dir is refused while the first runs, naming it."""
import os
import os.path as osp
import signal
import subprocess
import sys
import time

import pytest
from repo_files import REPO, load_file

_own_folder = load_file('tests/test_demo/test_demo_runs.py')._own_folder
pytestmark = pytest.mark.skipif(not sys.platform.startswith('linux'), reason='uses /proc')


def _processes() -> dict:
    """pid -> (parent pid, state) of every process."""
    out = {}
    for entry in os.listdir('/proc'):
        if entry.isdigit():
            try:
                with open(f'/proc/{entry}/stat') as f:
                    fields = f.read().rsplit(')', 1)[1].split()
            except OSError:
                continue
            out[int(entry)] = (int(fields[1]), fields[0])
    return out


def _tree(root: int) -> list:
    procs, found, todo = _processes(), [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += [p for p, (ppid, _) in procs.items() if ppid == pid]
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
            return f.read().replace(b'\0', b' ').decode()
    except OSError:
        return ''


def _alive(pids) -> list:
    procs = _processes()
    return [p for p in pids if p in procs and procs[p][1] != 'Z']


def _demo(args, **kwargs):
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')
    return subprocess.Popen([sys.executable, osp.join(REPO, 'tools/demo.py'), *args], cwd=REPO,
                            env=env, text=True, **kwargs)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigterm_ends_the_demo_and_its_training_child(tmp_path):
    data, work = tmp_path / 'mine', tmp_path / 'wd'
    data.mkdir()
    _own_folder(str(data))
    args = ['--data-root', str(data), '--work-dir', str(work), '--seeds', '1', '--cfg-options',
            'train_cfg.max_epochs=1000', 'train_dataloader.batch_size=4',
            'train_dataloader.num_workers=1', 'custom_hooks.1.patience=100000']
    demo = _demo(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tree = []
    try:
        deadline = time.monotonic() + 300
        while not (work / '.mmdinomamba.lock').exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        second = _demo(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # the same dir
        train = []
        while not train and time.monotonic() < deadline and demo.poll() is None:
            time.sleep(0.5)
            train = [p for p in _tree(demo.pid) if 'tools/train.py' in _cmdline(p)]
        assert train, 'the demo did not start tools/train.py'
        _, err = second.communicate(timeout=120)
        assert second.returncode == 1
        assert f'is in use by process {demo.pid}' in err and 'tools/demo.py' in err
        log = work / 'pretrain.log'
        while 'Epoch(train)' not in (log.read_text() if log.exists() else '') and \
                time.monotonic() < deadline and demo.poll() is None:
            time.sleep(0.5)  # until training (and its data loader worker) is under way
        tree = _tree(demo.pid)
        assert len(tree) >= 2
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(timeout=5) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 5
        while _alive(tree) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _alive(tree) == [], [_cmdline(p) for p in _alive(tree)]
        assert not (work / '.mmdinomamba.lock').exists()
    finally:
        for pid in _alive(set(tree) | set(_tree(demo.pid))):
            os.kill(pid, signal.SIGKILL)
        demo.wait()
