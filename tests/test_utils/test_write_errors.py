"""Out of space or permission on the work dir: the error names the path and what was being
written, and nothing that was there is lost (mocked ENOSPC / EACCES)."""
import errno
import os
import os.path as osp

import pytest
import torch
from mmengine.fileio.backends import LocalBackend
from mmengine.logging import MessageHub, MMLogger

from mmdinomamba.engine.hooks import AtomicCheckpointHook
from mmdinomamba.utils.files import WorkDirWriteError, explain_write_errors, write_text_atomic


def _fail_with(code):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))
    return fail


class _Runner:
    """What the checkpoint hook uses of a runner; ``save_checkpoint`` writes 1000 bytes."""
    epoch, iter, train_loop = 0, 0, None
    logger = MMLogger.get_instance('write_errors_test')

    def __init__(self, work_dir):
        self.work_dir = str(work_dir)
        self.message_hub = MessageHub.get_instance(f'write_errors_{id(self)}')

    def save_checkpoint(self, out_dir, filename, *args, **kwargs):
        LocalBackend().put(b'c' * 1000, osp.join(out_dir, filename))


@pytest.mark.parametrize('code, why', [(errno.ENOSPC, 'no space left on the device'),
                                       (errno.EACCES, 'permission denied')])
def test_checkpoint_saving_names_the_checkpoint(tmp_path, monkeypatch, code, why):
    runner = _Runner(tmp_path)
    hook = AtomicCheckpointHook(interval=1, max_keep_ckpts=1)
    hook.before_train(runner)
    hook._save_checkpoint(runner)
    first = osp.join(tmp_path, 'epoch_1.pth')
    monkeypatch.setattr(LocalBackend, 'put', _fail_with(code))
    runner.epoch = 1
    with pytest.raises(WorkDirWriteError) as err:
        hook._save_checkpoint(runner)
    message = str(err.value)
    assert err.value.errno == code
    assert message.startswith(
        f'cannot write the checkpoint {osp.join(tmp_path, "epoch_2.pth")}: {why}')
    assert message.endswith(f'; the previous checkpoint {first} is kept')
    if code == errno.ENOSPC:
        assert 'MiB free in' in message
    assert sorted(os.listdir(tmp_path)) == ['epoch_1.pth', 'last_checkpoint']
    assert open(osp.join(tmp_path, 'last_checkpoint')).read() == first


def test_atomic_text_file_keeps_its_old_content(tmp_path, monkeypatch):
    path = str(tmp_path / 'summary.json')
    write_text_atomic(path, 'old')
    monkeypatch.setattr(os, 'fsync', _fail_with(errno.ENOSPC))
    with pytest.raises(WorkDirWriteError, match=f'cannot write the summary {path}: no space'):
        write_text_atomic(path, 'new', 'the summary')
    assert open(path).read() == 'old' and os.listdir(tmp_path) == ['summary.json']


def test_errors_about_other_files_pass_unchanged(tmp_path):
    with pytest.raises(PermissionError) as err:
        with explain_write_errors(str(tmp_path / 'out'), 'the outputs'):
            raise PermissionError(errno.EACCES, 'Permission denied', '/data/images/a.png')
    assert not isinstance(err.value, WorkDirWriteError)
    with pytest.raises(FileNotFoundError):
        with explain_write_errors(str(tmp_path / 'out'), 'the outputs'):
            raise FileNotFoundError(errno.ENOENT, 'No such file', str(tmp_path / 'out'))


def test_converter_output_on_a_full_disk(tmp_path, monkeypatch):
    from mmdinomamba.models.utils import save_atomic
    dst = str(tmp_path / 'out.pth')
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, 'save', save)
    with pytest.raises(WorkDirWriteError, match=f'cannot write the converted weights {dst}'):
        save_atomic({'w': torch.zeros(2)}, dst)
    assert os.listdir(tmp_path) == []


def test_demo_lock_in_a_folder_without_permission(tmp_path, monkeypatch):
    from mmdinomamba.utils.workdir_lock import work_dir_lock
    monkeypatch.setattr(os, 'open', _fail_with(errno.EACCES))
    with pytest.raises(WorkDirWriteError, match='cannot write the lock file of the work dir '
                       f'{tmp_path}/.mmdinomamba.lock: permission denied'):
        with work_dir_lock(str(tmp_path)):
            pass


def test_a_full_disk_under_torch_save_to_a_path(tmp_path, monkeypatch):
    """``torch.save(obj, path)`` reports a failed write as a RuntimeError without errno."""
    from mmdinomamba.models.utils import save_atomic
    dst = str(tmp_path / 'out.pth')

    def save(obj, f, *args, **kwargs):
        raise RuntimeError('[enforce fail at inline_container.cc:664] . PytorchStreamWriter '
                           'failed writing file data/0: file write failed')

    monkeypatch.setattr(torch, 'save', save)
    with pytest.raises(WorkDirWriteError, match=f'cannot write the converted weights {dst}: '
                       'PyTorch could not write the file .* MiB free in'):
        save_atomic({'w': torch.zeros(2)}, dst)
    assert os.listdir(tmp_path) == []
