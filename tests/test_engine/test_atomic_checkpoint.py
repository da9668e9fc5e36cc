"""A kill while a checkpoint is being saved leaves the previous checkpoint and ``last_checkpoint``
intact (``max_keep_ckpts=1``, as in the demo), and every config uses the hook that does it."""
import glob
import os
import os.path as osp
import re
import socket
import subprocess
import sys
import uuid

import pytest
import torch
from mmengine.fileio.backends import LocalBackend
from mmengine.hooks import CheckpointHook
from mmengine.logging import MessageHub, MMLogger
from repo_files import load_file

from mmdinomamba.engine.hooks import AtomicCheckpointHook

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs (not even ``except Exception``)."""


def _kill_during_write(monkeypatch, on_call):
    """``LocalBackend.put`` opens its file, writes half of it and dies on call ``on_call``."""
    real, calls = LocalBackend.put, []

    def put(self, obj, filepath):
        calls.append(filepath)
        if len(calls) == on_call:
            with open(filepath, 'wb') as f:
                f.write(obj[:len(obj) // 2])
            raise Killed
        return real(self, obj, filepath)

    monkeypatch.setattr(LocalBackend, 'put', put)
    return calls


def _dino_cfg(root, work_dir, name, resume=False):
    cfg = load_file('tests/test_models/test_selfsup/test_dino_resume.py')._cfg(
        root, work_dir, name, resume)
    cfg.train_cfg.max_epochs = 2
    cfg.default_hooks.checkpoint.max_keep_ckpts = 1  # the demo's setting
    return cfg


def _train(cfg):
    from mmengine.runner import Runner
    runner = Runner.from_cfg(cfg)
    runner.train()
    return runner


def _last(work_dir):
    with open(osp.join(work_dir, 'last_checkpoint')) as f:
        return f.read().strip()


def test_kill_while_saving_keeps_the_previous_checkpoint(embedded_root, tmp_path, monkeypatch):
    work = tmp_path / 'run'
    cfg = _dino_cfg(embedded_root, work, 'killed')
    assert cfg.default_hooks.checkpoint.type == 'AtomicCheckpointHook'
    calls = _kill_during_write(monkeypatch, on_call=2)  # dies writing the epoch-2 checkpoint
    with pytest.raises(Killed):
        _train(cfg)
    assert len(calls) == 2
    last = _last(work)
    assert osp.basename(last) == 'epoch_1.pth' and osp.isfile(last)
    ckpt = torch.load(last, map_location='cpu', weights_only=False)
    assert ckpt['meta']['epoch'] == 1
    assert not (work / 'epoch_2.pth').exists()
    # the half-written scratch file was removed; a real SIGKILL leaves it: see below
    assert [f for f in os.listdir(work) if f.startswith('.')] == []
    monkeypatch.undo()
    runner = _train(_dino_cfg(embedded_root, work, 'resumed', resume=True))
    assert runner.iter == 12 and osp.basename(_last(work)) == 'epoch_2.pth'
    assert sorted(f for f in os.listdir(work) if f.endswith('.pth')) == ['epoch_2.pth']


def _dead_pid():
    proc = subprocess.Popen([sys.executable, '-c', 'pass'])
    proc.wait()
    return proc.pid


def _bare_runner(work_dir):
    """What CheckpointHook uses of a runner, with a save_checkpoint that writes ``tag``."""

    class FakeRunner:
        epoch, iter, train_loop = 0, 0, None
        logger = MMLogger.get_instance('atomic_ckpt_test')

        def __init__(self):
            self.work_dir, self.tag = str(work_dir), b''
            self.message_hub = MessageHub.get_instance(f'atomic_ckpt_test_{uuid.uuid4().hex}')

        def save_checkpoint(self, out_dir, filename, *args, **kwargs):
            LocalBackend().put(self.tag * 1000, osp.join(out_dir, filename))

    return FakeRunner()


def _best_run(work_dir, scores, monkeypatch=None, kill_at=None):
    runner = _bare_runner(work_dir)
    hook = AtomicCheckpointHook(interval=1, save_best='acc', rule='greater')
    hook.before_train(runner)
    for epoch, acc in enumerate(scores, 1):
        if epoch == kill_at:
            _kill_during_write(monkeypatch, on_call=1)
        runner.tag, runner.epoch = str(epoch).encode(), epoch
        hook.after_val_epoch(runner, dict(acc=acc))


def test_best_checkpoint_is_replaced_only_after_the_new_one_is_written(tmp_path, monkeypatch):
    _best_run(tmp_path, [0.5, 0.9])
    assert sorted(os.listdir(tmp_path)) == ['best_acc_epoch_2.pth']
    (tmp_path / 'killed').mkdir()
    with pytest.raises(Killed):
        _best_run(tmp_path / 'killed', [0.5, 0.9], monkeypatch, kill_at=2)
    assert sorted(os.listdir(tmp_path / 'killed')) == ['best_acc_epoch_1.pth']
    assert (tmp_path / 'killed' / 'best_acc_epoch_1.pth').read_bytes() == b'1' * 1000


def test_scratch_files_of_killed_runs_are_removed_at_start(tmp_path):
    host = socket.gethostname()
    stale = tmp_path / f'.epoch_3.pth.partial-{host}-{_dead_pid()}-0123abcd'
    live = tmp_path / f'.epoch_3.pth.partial-{host}-{os.getpid()}-0123abcd'
    keep = tmp_path / 'epoch_2.pth'
    for f in (stale, live, keep):
        f.write_bytes(b'x')
    AtomicCheckpointHook(interval=1).before_train(_bare_runner(tmp_path))
    assert not stale.exists() and live.exists() and keep.exists()


def test_mmengine_hook_would_lose_everything(tmp_path, monkeypatch):
    """Why the hook exists: mmengine's CheckpointHook with max_keep_ckpts=1 deletes the old
    checkpoint first, so a kill while saving leaves no complete checkpoint."""
    runner = _bare_runner(tmp_path)
    hook = CheckpointHook(interval=1, max_keep_ckpts=1)
    hook.before_train(runner)
    runner.tag = b'a'
    hook._save_checkpoint(runner)
    _kill_during_write(monkeypatch, on_call=1)
    runner.epoch = 1
    with pytest.raises(Killed):
        hook._save_checkpoint(runner)
    assert _last(tmp_path) == osp.join(tmp_path, 'epoch_1.pth')  # a deleted file
    assert not osp.exists(osp.join(tmp_path, 'epoch_1.pth'))
    monkeypatch.undo()
    (tmp_path / 'atomic').mkdir()
    runner = _bare_runner(tmp_path / 'atomic')
    atomic = AtomicCheckpointHook(interval=1, max_keep_ckpts=1)
    atomic.before_train(runner)
    runner.tag = b'a'
    atomic._save_checkpoint(runner)
    _kill_during_write(monkeypatch, on_call=1)
    runner.epoch = 1
    with pytest.raises(Killed):
        atomic._save_checkpoint(runner)
    first = str(tmp_path / 'atomic' / 'epoch_1.pth')
    assert open(first, 'rb').read() == b'a' * 1000 and _last(tmp_path / 'atomic') == first


def test_every_config_uses_the_atomic_hook():
    from mmdinomamba.utils.cli import load_config
    files = sorted(glob.glob(osp.join(REPO, 'configs/**/*.py'), recursive=True))
    for path in files:
        text = open(path).read()
        assert not re.search(r"type=['\"]CheckpointHook['\"]", text), path
    # one config of every folder, resolved through its bases (mmpretrain / mmseg / mmdet)
    leaves = {}
    for path in files:
        if '/_base_/' not in path:
            leaves.setdefault(osp.dirname(path), path)
    for path in leaves.values():
        if ('/seg/' in path or '/det/' in path) and not _has_downstream():
            continue
        cfg = load_config(path)
        assert cfg.default_hooks.checkpoint.type == 'AtomicCheckpointHook', path


def _has_downstream():
    try:
        import mmdet  # noqa: F401
        import mmseg  # noqa: F401
    except ImportError:
        return False
    return True
