"""Writing files so that a kill never leaves a half-written one in place.

A file or folder is written under a hidden scratch name that names its owner (host and process id)
and renamed into place when complete (``os.replace`` is atomic on one file system). Scratch entries
whose owner process is gone are stale: the next run removes them. A write that fails for want
of space or permission (:func:`explain_write_errors`) is an error naming the path and what was
being written, with the free space where it was written.
"""
import errno
import os
import os.path as osp
import re
import shutil
import socket
import uuid
from contextlib import contextmanager
from typing import Optional

_SCRATCH = re.compile(r'^\.(?P<name>.+)\.(?P<kind>[a-z]+)-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{8}$')


def scratch_path(path: str, kind: str = 'partial') -> str:
    """A hidden sibling of ``path``: ``.<name>.<kind>-<host>-<pid>-<8 hex>``.

    Args:
        path (str): the final path.
        kind (str): lower-case tag, e.g. ``'partial'`` (being written) or ``'old'`` (being
            removed). Defaults to 'partial'.
    """
    parent, name = osp.split(osp.abspath(path))
    return osp.join(parent, f'.{name}.{kind}-{socket.gethostname()}-{os.getpid()}-'
                    f'{uuid.uuid4().hex[:8]}')


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, owned by another user
        return True
    return True


def stale_scratch_target(entry: str) -> Optional[str]:
    """The final name that the scratch entry ``entry`` (a base name) was written for, if it was
    made by :func:`scratch_path` on this host by a process that no longer runs; else None."""
    match = _SCRATCH.match(entry)
    if match is None or match['host'] != socket.gethostname() or pid_alive(int(match['pid'])):
        return None
    return match['name']


def fsync_file(path: str) -> None:
    """Flush ``path``'s content to disk."""
    with open(path, 'rb+') as f:
        os.fsync(f.fileno())


#: the errors of a write that the user must act on, and what they mean
WRITE_ERRORS = {
    errno.ENOSPC: 'no space left on the device',
    errno.EDQUOT: 'the disk quota is exceeded',
    errno.EACCES: 'permission denied',
    errno.EPERM: 'operation not permitted',
    errno.EROFS: 'the file system is read-only',
}
_ADVICE = {
    errno.ENOSPC: 'free space there or choose another folder (e.g. --work-dir)',
    errno.EDQUOT: 'free space there or choose another folder (e.g. --work-dir)',
    errno.EROFS: 'choose a writable folder (e.g. --work-dir)',
}


class WorkDirWriteError(OSError):
    """A write failed for want of space or permission; the message names the path and what
    was being written (``errno`` is that of the original error)."""

    def __str__(self) -> str:
        return self.strerror


def _free_space(path: str) -> str:
    folder = osp.dirname(osp.abspath(path))
    while folder and not osp.isdir(folder):
        folder = osp.dirname(folder)
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return ''
    return f'; {free / 2**20:.1f} MiB free in {folder}'


def describe_write_error(err: OSError, path: str, what: str, note: str = '') -> str:
    """One line: what failed (``what`` at ``path``), why, what to do (then ``note``)."""
    why = WRITE_ERRORS.get(err.errno, err.strerror)
    where = f' (at {err.filename})' if err.filename and osp.abspath(str(err.filename)) != \
        osp.abspath(path) else ''
    advice = _ADVICE.get(err.errno, f'make {osp.dirname(osp.abspath(path))} writable for '
                         'this user or choose another folder (e.g. --work-dir)')
    space = _free_space(path) if err.errno in (errno.ENOSPC, errno.EDQUOT) else ''
    return f'cannot write {what} {path}{where}: {why}{space}; {advice}' + (
        f'; {note}' if note else '')


def _concerns(filename, path: str) -> bool:
    """Whether an error about ``filename`` is one of writing ``path`` (the file, a sibling
    scratch file, or a file inside the folder ``path``)."""
    if filename is None:
        return True
    name, path = osp.abspath(str(filename)), osp.abspath(path)
    folder = path if osp.isdir(path) else osp.dirname(path)
    return name == path or name.startswith(folder.rstrip(os.sep) + os.sep)


@contextmanager
def explain_write_errors(path: str, what: str, note: str = ''):
    """Turn an out-of-space or permission ``OSError`` in the block into a
    :class:`WorkDirWriteError` naming ``path`` and ``what`` was being written (e.g. 'the
    checkpoint'), ``note`` last (e.g. what was kept). Other errors pass unchanged, as do errors
    about files elsewhere (e.g. reading the data) and errors already explained."""
    try:
        yield
    except WorkDirWriteError:
        raise
    except OSError as err:
        if err.errno not in WRITE_ERRORS or not _concerns(err.filename, path):
            raise
        raise WorkDirWriteError(err.errno, describe_write_error(err, path, what, note),
                                str(path)) from err
    except RuntimeError as err:  # torch.save to a path: its C++ writer reports no errno
        if 'PytorchStreamWriter failed writing' not in str(err):
            raise
        first = str(err).strip().splitlines()[0][-120:]
        message = (f'cannot write {what} {path}: PyTorch could not write the file ({first})'
                   f'{_free_space(path)}; if the disk is full, free space there or choose '
                   'another folder (e.g. --work-dir)' + (f'; {note}' if note else ''))
        raise WorkDirWriteError(errno.EIO, message, str(path)) from err


def write_bytes_atomic(path: str, data: bytes, what: str = 'the file') -> None:
    """Write ``data`` to ``path`` through a scratch file and ``os.replace``: readers see the old
    content or the new one, never a part. Out of space or permission: a
    :class:`WorkDirWriteError` naming ``path`` and ``what`` it is (the old content stays)."""
    tmp = scratch_path(path)
    try:
        with explain_write_errors(path, what):
            with open(tmp, 'wb') as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
    except BaseException:
        if osp.exists(tmp):
            os.remove(tmp)
        raise


def write_text_atomic(path: str, text: str, what: str = 'the file') -> None:
    """:func:`write_bytes_atomic` of ``text`` encoded as UTF-8."""
    write_bytes_atomic(path, text.encode('utf-8'), what)
