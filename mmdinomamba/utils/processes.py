"""Child processes that never outlive the tool that started them (``tools/demo.py``).

A child (``tools/train.py``) started with :func:`start_child`

* runs in its own process group, so that :func:`end_child` ends it together with what it
  started (data loader workers) by one ``killpg``: ``SIGTERM``, then ``SIGKILL`` after a grace
  period;
* on Linux, is sent ``SIGTERM`` by the kernel when its parent dies, even by ``SIGKILL``
  (``prctl(PR_SET_PDEATHSIG)``). The ``prctl`` runs in a tiny Python launcher that then
  ``exec``-s the command (same process id), rather than in a ``preexec_fn``, which may deadlock
  in a parent with threads (torch's). Other systems lack it: there the child ends only through
  the parent's handlers below.

:func:`ending_children_on_signals` turns ``SIGTERM``, ``SIGHUP`` and ``SIGINT`` into
:class:`Terminated` (a ``SystemExit``), so that the ``finally`` of the code waiting for a child
ends it, then leaves at once (``os._exit``: tearing down an interpreter that imported torch
takes seconds on a loaded machine); an exit of the parent for any other reason goes through
the same ``finally``.
"""
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from typing import Sequence

__all__ = ['start_child', 'end_child', 'ending_children_on_signals', 'Terminated',
           'PARENT_DEATH_SIGNAL']

#: the signal a child gets from the kernel when its parent dies (Linux)
PARENT_DEATH_SIGNAL = signal.SIGTERM
_PR_SET_PDEATHSIG = 1
#: run before the command, in the child: ask for the parent-death signal, give up if the
#: parent is already gone (it died between fork and prctl), then become the command
_LAUNCHER = (
    'import ctypes, os, sys\n'
    'ctypes.CDLL(None, use_errno=True).prctl({option}, {signum}, 0, 0, 0)\n'
    'if os.getppid() != {parent}:\n'
    '    sys.exit("parent process {parent} ended before its child started")\n'
    'os.execvp(sys.argv[1], sys.argv[1:])\n')


def _launcher(cmd: Sequence[str]) -> list:
    if not sys.platform.startswith('linux'):
        return list(cmd)
    code = _LAUNCHER.format(option=_PR_SET_PDEATHSIG, signum=int(PARENT_DEATH_SIGNAL),
                            parent=os.getpid())
    return [sys.executable, '-S', '-c', code, *cmd]


def start_child(cmd: Sequence[str], **popen_kwargs) -> subprocess.Popen:
    """``subprocess.Popen(cmd, **popen_kwargs)`` in a new process group of its own, ended by
    the kernel when this process dies (Linux). End it with :func:`end_child`."""
    popen_kwargs.setdefault('start_new_session', True)  # new session: own process group
    return subprocess.Popen(_launcher(cmd), **popen_kwargs)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def end_child(proc: subprocess.Popen, grace: float = 3.0) -> None:
    """End ``proc`` and every process of its group: ``SIGTERM``, then ``SIGKILL`` for what
    still runs after ``grace`` seconds. Waits for ``proc`` (no zombie is left); a no-op when
    the group is already gone."""
    pgid = proc.pid
    if _group_alive(pgid):
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            proc.poll()
            if not _group_alive(pgid):
                break
            time.sleep(0.05)
        else:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for stream in (proc.stdout, proc.stderr, proc.stdin):
        if stream is not None:
            stream.close()
    proc.wait()


class Terminated(SystemExit):
    """Raised in the main thread by a signal; the exit code is ``128 + signal``."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


def _raise_exit(signum, _frame):
    raise Terminated(signum)


#: the signals that end the parent (and so its children)
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


@contextmanager
def ending_children_on_signals(name: str = ''):
    """Within the block, ``SIGTERM``, ``SIGHUP`` and ``SIGINT`` raise :class:`Terminated`
    (``SystemExit(128 + signal)``) in the main thread, so ``finally`` clauses run and end the
    children (:func:`end_child`). Then the process says so on stderr (``name``: who) and
    leaves with that code without the interpreter's teardown. The previous handlers come back
    when the block ends otherwise."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only; its own handlers apply
        return
    previous = {s: signal.signal(s, _raise_exit) for s in ENDING_SIGNALS}
    try:
        yield
    except Terminated as err:
        for s, handler in previous.items():
            signal.signal(s, handler)
        sys.stdout.flush()
        print(f'{name}ended by {signal.Signals(err.signum).name}; its child processes are '
              'ended', file=sys.stderr, flush=True)
        os._exit(err.code)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
