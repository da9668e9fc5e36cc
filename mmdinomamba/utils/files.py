"""Writing files so that a kill never leaves a half-written one in place.

A file or folder is written under a hidden scratch name that names its owner (host and process id)
and renamed into place when complete (``os.replace`` is atomic on one file system). Scratch entries
whose owner process is gone are stale: the next run removes them.
"""
import os
import os.path as osp
import re
import socket
import uuid
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


def write_bytes_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a scratch file and ``os.replace``: readers see the old
    content or the new one, never a part."""
    tmp = scratch_path(path)
    try:
        with open(tmp, 'wb') as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if osp.exists(tmp):
            os.remove(tmp)
        raise


def write_text_atomic(path: str, text: str) -> None:
    """:func:`write_bytes_atomic` of ``text`` encoded as UTF-8."""
    write_bytes_atomic(path, text.encode('utf-8'))
