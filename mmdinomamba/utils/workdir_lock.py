"""One live run per work dir: a lock file naming its process.

Two runs writing the same work dir overwrite each other's checkpoints and ``last_checkpoint``.
:func:`work_dir_lock` holds an exclusive ``flock`` on ``<work_dir>/.mmdinomamba.lock`` for the
whole run and writes into it the process id, host, command line and start time; a second run
in that folder stops at once with :class:`WorkDirInUseError`, naming the other process. The
kernel releases the lock when its process ends, however it ends, so a lock file left by a
killed run (its process no longer runs) is taken over, with a note naming that process.
"""
import fcntl
import json
import logging
import os
import os.path as osp
import shlex
import socket
import sys
import time
from contextlib import contextmanager

from .files import explain_write_errors, pid_alive

__all__ = ['LOCK_NAME', 'WorkDirInUseError', 'work_dir_lock', 'lock_holder']

LOCK_NAME = '.mmdinomamba.lock'


class WorkDirInUseError(RuntimeError):
    """The work dir is locked by another live run."""


def _describe(info: dict) -> str:
    return (f"process {info.get('pid', '?')} on {info.get('host', '?')} "
            f"({info.get('cmdline', '?')}), started {info.get('started', '?')}")


def lock_holder(work_dir: str) -> dict:
    """What the lock file of ``work_dir`` says of its holder (empty when there is none)."""
    try:
        with open(osp.join(work_dir, LOCK_NAME)) as f:
            return json.loads(f.read() or '{}')
    except (OSError, ValueError):
        return {}


def _open_locked(path: str) -> int:
    """Open ``path`` and take its exclusive lock; retry when the file was replaced meanwhile
    (a run releasing it removes the file). Raises ``BlockingIOError`` when it is held."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            os.close(fd)
            raise
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _note_stale(path: str, fd: int, log) -> None:
    old = os.read(fd, 1 << 16).decode('utf-8', 'replace')
    try:
        info = json.loads(old) if old.strip() else {}
    except ValueError:
        info = {}
    if info:
        alive = info.get('host') == socket.gethostname() and pid_alive(int(info.get('pid', 0)))
        state = 'which no longer holds it' if alive else 'which no longer runs'
        log(f'{path}: taking over the lock left by {_describe(info)}, {state}')


@contextmanager
def work_dir_lock(work_dir: str, enabled: bool = True, log=None):
    """Hold the lock of ``work_dir`` (created when missing) for the ``with`` block.

    Args:
        work_dir (str): the folder.
        enabled (bool): False: do nothing (e.g. on the other processes of a distributed
            run, which share the folder with process 0). Defaults to True.
        log (callable, optional): gets the note on a stale lock taken over; default: a
            warning in mmengine's current logger.

    Raises:
        WorkDirInUseError: another live process holds the lock (the message names it).
        WorkDirWriteError: the folder cannot be created or written (names it).
    """
    if not enabled:
        yield
        return
    if log is None:
        from mmengine.logging import print_log

        def log(msg):
            print_log(msg, logger='current', level=logging.WARNING)
    path = osp.join(osp.abspath(work_dir), LOCK_NAME)
    with explain_write_errors(path, 'the lock file of the work dir'):
        os.makedirs(osp.dirname(path), exist_ok=True)
        try:
            fd = _open_locked(path)
        except BlockingIOError:
            raise WorkDirInUseError(
                f'work dir {osp.dirname(path)} is in use by {_describe(lock_holder(work_dir))}: '
                'wait for it to finish, end it, or choose another --work-dir') from None
        try:
            _note_stale(path, fd, log)
            info = dict(pid=os.getpid(), host=socket.gethostname(),
                        cmdline=shlex.join([osp.basename(sys.executable), *sys.argv]),
                        started=time.strftime('%Y-%m-%d %H:%M:%S'))
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(info).encode('utf-8'))
        except BaseException:
            os.close(fd)
            raise
    try:
        yield
    finally:
        try:
            os.remove(path)
        except OSError:
            pass
        os.close(fd)
