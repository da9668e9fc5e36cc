"""tools/gpu/bench_official.py: what it needs is named before any GPU work."""
import importlib.util

import pytest
from repo_files import load_file


def _tool():
    return load_file('tools/gpu/bench_official.py')


def test_missing_snapshot_is_named(tmp_path):
    with pytest.raises(SystemExit, match=f'{tmp_path}.*has no models_vim.py'):
        _tool().main(['--repo', str(tmp_path)])


def test_missing_packages_are_named(tmp_path, monkeypatch):
    (tmp_path / 'models_vim.py').write_text('raise AssertionError("must not be imported")\n')
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, 'find_spec',
                        lambda name, *a: None if name == 'causal_conv1d' else real(name, *a))
    with pytest.raises(SystemExit, match='needs .*causal_conv1d'):
        _tool().main(['--repo', str(tmp_path)])


def test_batch_per_resolution(tmp_path):
    with pytest.raises(SystemExit, match='one value per --res'):
        _tool().main(['--repo', str(tmp_path), '--res', '224', '512', '--batch', '64'])


def test_dino_mode_names_the_missing_official_loop(tmp_path):
    (tmp_path / 'models_vim.py').write_text('raise AssertionError("must not be imported")\n')
    with pytest.raises(SystemExit, match=r'--dino: .*lacks main_dino_vim.py, utils.py'):
        _tool().main(['--repo', str(tmp_path), '--dino'])
