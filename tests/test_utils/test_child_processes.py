"""The demo's children end with it: SIGTERM / SIGINT to the parent end the child and what the
child started (one process group); a SIGKILLed parent's child is ended by the kernel (Linux).
The parent here is a small script using :mod:`mmdinomamba.utils.processes` as the demo does
(its children sleep), so the test takes seconds; ``test_demo_children`` runs the demo itself."""
import os
import os.path as osp
import signal
import subprocess
import sys
import textwrap
import time

import pytest

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
pytestmark = pytest.mark.skipif(not sys.platform.startswith('linux'),
                                reason='process groups and the parent-death signal: Linux')

#: a parent that starts a child which starts a grandchild, prints their pids, then waits for
#: the child inside the demo's handlers (the module is loaded by path: no torch import)
PARENT = textwrap.dedent('''
    import importlib.util, subprocess, sys
    spec = importlib.util.spec_from_file_location('processes', sys.argv[1])
    processes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(processes)
    child_code = (
        'import subprocess, sys, time\\n'
        'g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])\\n'
        'print("pids", __import__("os").getpid(), g.pid, flush=True)\\n'
        'time.sleep(60)\\n')
    with processes.ending_children_on_signals():
        proc = processes.start_child([sys.executable, '-c', child_code],
                                     stdout=subprocess.PIPE, text=True)
        try:
            for line in proc.stdout:
                print(line, end='', flush=True)
            proc.wait()
        finally:
            processes.end_child(proc)
''')


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent to reap it does not count)."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except FileNotFoundError:
        return False


def _wait_gone(pids, timeout=5.0) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _start_parent(tmp_path):
    script = tmp_path / 'parent.py'
    script.write_text(PARENT)
    parent = subprocess.Popen(
        [sys.executable, str(script), osp.join(REPO, 'mmdinomamba/utils/processes.py')],
        stdout=subprocess.PIPE, text=True)
    line = parent.stdout.readline()
    assert line.startswith('pids'), line
    child, grandchild = (int(x) for x in line.split()[1:])
    return parent, child, grandchild


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT])
def test_signal_to_the_parent_ends_its_whole_tree(tmp_path, signum):
    parent, child, grandchild = _start_parent(tmp_path)
    assert os.getpgid(child) == child != os.getpgid(parent.pid)  # its own process group
    try:
        parent.send_signal(signum)
        assert parent.wait(timeout=5) != 0
        assert _wait_gone([parent.pid, child, grandchild]) == []
    finally:
        for pid in (parent.pid, child, grandchild):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_killed_parent_takes_its_child_along(tmp_path):
    parent, child, grandchild = _start_parent(tmp_path)
    try:
        parent.kill()  # SIGKILL: no handler runs; the kernel sends the child SIGTERM
        parent.wait(timeout=5)
        assert _wait_gone([child]) == []
    finally:
        for pid in (child, grandchild):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
