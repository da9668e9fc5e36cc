"""Every shipped config loads with ``mmengine.Config.fromfile`` in a fresh interpreter that has
not imported ``mmdinomamba`` (as the libraries' own ``tools/train.py`` / ``test.py`` load them),
from another working directory; each names the package in ``custom_imports``, which is how
those tools import it."""
import glob
import json
import re
import os
import os.path as osp
import subprocess
import sys

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

# Parses each config without importing its custom_imports, then reports what was imported.
SCRIPT = r'''
import glob, json, os, sys
from mmengine.config import Config
paths = json.loads(sys.argv[1])
out = dict(failures={}, custom_imports={}, scopes={})
for path in paths:
    try:
        cfg = Config.fromfile(path, import_custom_modules=False)
        out['custom_imports'][path] = list(cfg.get('custom_imports', {}).get('imports', []))
        out['scopes'][path] = cfg.get('default_scope')
    except Exception as e:  # noqa: BLE001  (reported, the test fails on it)
        out['failures'][path] = f'{type(e).__name__}: {e}'
out['imported'] = sorted(m for m in sys.modules if m.split('.')[0] == 'mmdinomamba')
print(json.dumps(out))
'''


def shipped_configs():
    """The leaf configs under configs/ (``_base_`` folders hold fragments)."""
    paths = glob.glob(osp.join(REPO, 'configs', '**', '*.py'), recursive=True)
    return sorted(p for p in paths if '_base_' not in osp.relpath(p, REPO).split(os.sep))


def test_every_config_loads_without_the_package(tmp_path):
    paths = shipped_configs()
    assert len(paths) > 80  # all folders found
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}  # nothing of ours on path
    proc = subprocess.run([sys.executable, '-c', SCRIPT, json.dumps(paths)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out['failures'] == {}, json.dumps(out['failures'], indent=1)[:4000]
    assert out['imported'] == []  # parsed without importing mmdinomamba
    missing = [p for p, imports in out['custom_imports'].items() if 'mmdinomamba' not in imports]
    assert missing == []
    for path, scope in out['scopes'].items():
        folder = osp.relpath(path, REPO).split(os.sep)[1]
        expected = dict(seg='mmseg', det='mmdet').get(folder, 'mmpretrain')
        assert scope == expected, (path, scope)


def test_no_config_uses_the_mmseg_scope():
    """``mmseg::`` bases need the distribution ``mmsegmentation``, which the OneDL release is
    not; the seg configs inherit our own bases instead (see docs/design.md)."""
    offenders = [p for p in glob.glob(osp.join(REPO, 'configs', '**', '*.py'), recursive=True)
                 if re.search(r'''['"]mmseg::''', open(p).read())]
    assert offenders == []
