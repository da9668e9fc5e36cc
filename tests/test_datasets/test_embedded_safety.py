"""The embedded data set on disk is never replaced without an explicit flag, generation is always
logged, and killed generations leave nothing behind for good."""
import os
import os.path as osp
import socket
import stat
import subprocess
import sys
import time

import pytest
from repo_files import load_file

from mmdinomamba.datasets import embedded
from mmdinomamba.datasets.embedded import (EmbeddedDataMismatchError, EmbeddedShapes,
                                           generate_embedded_dataset)

TINY = dict(num_train=4, num_val=2, img_size=16, seed=0)


@pytest.fixture
def logs(monkeypatch):
    """Messages logged by the generator."""
    records = []
    monkeypatch.setattr(embedded, 'print_log',
                        lambda msg, logger=None, level=None: records.append(msg))
    return records


def _snapshot(root):
    """{relative path: (size, mtime_ns)} of every file under ``root``."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            st = os.stat(osp.join(d, f))
            out[osp.relpath(osp.join(d, f), root)] = (st.st_size, st.st_mtime_ns)
    return out


def test_other_parameters_never_replace_an_existing_set(tmp_path):
    root = generate_embedded_dataset(tmp_path / 'emb', **TINY)
    before = _snapshot(root)
    with pytest.raises(EmbeddedDataMismatchError) as err:
        generate_embedded_dataset(root, **dict(TINY, img_size=24))
    msg = str(err.value)
    assert root in msg and 'img_size' in msg and 'existing 16' in msg and 'requested 24' in msg
    assert 'overwrite=True' in msg and '--overwrite' in msg
    with pytest.raises(EmbeddedDataMismatchError, match='img_size'):
        EmbeddedShapes(data_root=root, img_size=24)
    assert _snapshot(root) == before
    # the existing sizes are read, not defaulted
    assert len(EmbeddedShapes(data_root=root, split='val')) == TINY['num_val']
    assert _snapshot(root) == before
    generate_embedded_dataset(root, **dict(TINY, img_size=24), overwrite=True)
    assert embedded._read_meta(root)['img_size'] == 24
    assert os.listdir(tmp_path) == ['emb']  # no scratch folder left


def test_dataset_overwrite_flag_and_generate_false(tmp_path):
    root = generate_embedded_dataset(tmp_path / 'emb', **TINY)
    ds = EmbeddedShapes(data_root=root, split='train', num_train=5, overwrite=True)
    assert len(ds) == 5 and embedded._read_meta(root)['img_size'] == TINY['img_size']
    with pytest.raises(FileNotFoundError, match='meta.json'):
        EmbeddedShapes(data_root=str(tmp_path / 'missing'), generate=False)
    with pytest.raises(TypeError, match='num_trian'):
        embedded.prepare_embedded_data(root, 'X', num_trian=3)


def test_generation_is_logged_with_absolute_path_and_size(tmp_path, monkeypatch, logs):
    monkeypatch.chdir(tmp_path)
    EmbeddedShapes(data_root='rel/emb', generate=True, **TINY)
    start = [m for m in logs if m.startswith('Generating')]
    assert len(start) == 1
    assert str(tmp_path / 'rel' / 'emb') in start[0]
    assert '4 train + 2 val images of 16x16 px' in start[0] and 'MB' in start[0]
    assert any(m.startswith('Embedded data set ready') for m in logs)
    logs.clear()
    EmbeddedShapes(data_root='rel/emb')  # existing, same parameters: nothing to log
    assert logs == []
    generate_embedded_dataset('rel/emb', **dict(TINY, seed=1), overwrite=True)
    assert any(m.startswith('Replacing') for m in logs)


def test_missing_data_is_an_error_naming_the_folder_and_the_command(tmp_path, monkeypatch):
    """Without generate=True nothing is written: the error names the absolute folder, the
    working directory a relative data_root was resolved against, and the command that makes
    the data (with the requested sizes)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as err:
        EmbeddedShapes(data_root='data/embedded', num_train=8)
    msg = str(err.value)
    assert str(tmp_path / 'data' / 'embedded') in msg and f'working directory {tmp_path}' in msg
    command = msg.split('`')[1]
    assert command.split()[1].endswith(os.path.join('tools', 'misc', 'make_embedded_data.py'))
    assert os.path.isfile(command.split()[1])
    assert f'--root {tmp_path / "data" / "embedded"} --num-train 8' in command
    assert 'generate=True' in msg
    assert os.listdir(tmp_path) == []  # nothing generated


def test_default_size_estimate_is_about_94_mb():
    n = embedded.DEFAULTS['num_train'] + embedded.DEFAULTS['num_val']
    assert 80 < embedded._approx_mb(n, embedded.DEFAULTS['img_size']) < 110


def test_a_folder_that_is_not_ours_is_never_written(tmp_path):
    (tmp_path / 'mine').mkdir()
    (tmp_path / 'mine' / 'thesis.tex').write_text('x')
    for overwrite in (False, True):
        with pytest.raises(FileExistsError, match='not an embedded data set'):
            generate_embedded_dataset(tmp_path / 'mine', **TINY, overwrite=overwrite)
    assert os.listdir(tmp_path / 'mine') == ['thesis.tex']


def test_generated_folders_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        root = generate_embedded_dataset(tmp_path / 'emb', **TINY)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(osp.join(root, 'train')).st_mode) == 0o755


def _dead_pid():
    proc = subprocess.Popen([sys.executable, '-c', 'pass'])
    proc.wait()
    return proc.pid


def test_scratch_folders_of_killed_runs_are_removed(tmp_path):
    host = socket.gethostname()
    dead = tmp_path / f'.emb.partial-{host}-{_dead_pid()}-0123abcd'
    live = tmp_path / f'.emb.partial-{host}-{os.getpid()}-0123abcd'
    other = tmp_path / f'.other.partial-{host}-{_dead_pid()}-0123abcd'  # another data root
    legacy_old, legacy_new = tmp_path / '.embedded-a1b2c3d4', tmp_path / '.embedded-zz99yy88'
    for d in (dead, live, other, legacy_old, legacy_new):
        (d / 'train').mkdir(parents=True)
    past = time.time() - 2 * 3600
    os.utime(legacy_old, (past, past))
    generate_embedded_dataset(tmp_path / 'emb', **TINY)
    assert not dead.exists() and not legacy_old.exists()
    assert live.exists() and other.exists() and legacy_new.exists()


def test_failed_generation_leaves_nothing(tmp_path, monkeypatch):
    calls = []

    def broken(*args):
        calls.append(args)
        if len(calls) == 3:
            raise RuntimeError('disk full')
        return real(*args)

    real = embedded.draw_sample
    monkeypatch.setattr(embedded, 'draw_sample', broken)
    with pytest.raises(RuntimeError, match='disk full'):
        generate_embedded_dataset(tmp_path / 'emb', **TINY)
    assert os.listdir(tmp_path) == []


def test_make_embedded_data_needs_overwrite(tmp_path):
    tool = load_file('tools/misc/make_embedded_data.py')
    root = str(tmp_path / 'emb')
    args = ['--root', root, '--num-train', '4', '--num-val', '2', '--img-size', '16']
    tool.main(args)
    before = _snapshot(root)
    tool.main(args)  # same parameters: kept as it is
    assert _snapshot(root) == before
    with pytest.raises(SystemExit, match=r'num_train: existing 4, requested 6.*--overwrite'):
        tool.main([*args, '--num-train', '6'])
    assert _snapshot(root) == before
    tool.main([*args, '--num-train', '6', '--overwrite'])
    assert embedded._read_meta(root)['num_train'] == 6
