"""One live run per work dir: a second one is refused naming the first; the lock of a killed
run is taken over with a note; the lock file goes when the run ends."""
import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from mmdinomamba.utils.workdir_lock import LOCK_NAME, WorkDirInUseError, work_dir_lock

#: another run holding the lock as ``work_dir_lock`` does (without importing the package)
HOLDER = textwrap.dedent('''
    import fcntl, json, os, socket, sys
    fd = os.open(os.path.join(sys.argv[1], sys.argv[2]), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps(dict(pid=os.getpid(), host=socket.gethostname(),
                                 cmdline='python tools/demo.py --marker')).encode())
    print('locked', flush=True)
    sys.stdin.read()
''')


def _dead_pid():
    proc = subprocess.Popen([sys.executable, '-c', 'pass'])
    proc.wait()
    return proc.pid


def test_a_second_run_is_refused_naming_the_first(tmp_path):
    holder = subprocess.Popen([sys.executable, '-c', HOLDER, str(tmp_path), LOCK_NAME],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == 'locked'
        with pytest.raises(WorkDirInUseError) as err:
            with work_dir_lock(str(tmp_path)):
                pass
        message = str(err.value)
        assert str(tmp_path) in message and f'process {holder.pid}' in message
        assert '--marker' in message and 'choose another --work-dir' in message
    finally:
        holder.communicate('', timeout=60)
    notes = []  # the kernel released the lock of the ended process: taken over
    with work_dir_lock(str(tmp_path), log=notes.append):
        assert json.loads((tmp_path / LOCK_NAME).read_text())['pid'] == os.getpid()
    assert len(notes) == 1 and f'process {holder.pid}' in notes[0]
    assert not (tmp_path / LOCK_NAME).exists()  # released and removed


def test_the_lock_of_a_dead_run_is_taken_over_with_a_note(tmp_path):
    dead = _dead_pid()
    (tmp_path / LOCK_NAME).write_text(json.dumps(dict(
        pid=dead, host=socket.gethostname(), cmdline='python tools/demo.py', started='then')))
    notes = []
    with work_dir_lock(str(tmp_path), log=notes.append):
        assert json.loads((tmp_path / LOCK_NAME).read_text())['pid'] == os.getpid()
    assert len(notes) == 1 and f'process {dead}' in notes[0] and 'no longer runs' in notes[0]
    assert 'tools/demo.py' in notes[0]


def test_the_work_dir_is_created_and_distributed_ranks_skip_the_lock(tmp_path):
    with work_dir_lock(str(tmp_path / 'new' / 'run')):
        assert (tmp_path / 'new' / 'run' / LOCK_NAME).exists()
    with work_dir_lock(str(tmp_path / 'other'), enabled=False):
        assert not (tmp_path / 'other').exists()
