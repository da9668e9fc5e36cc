"""A truncated, empty or foreign file given as a checkpoint: one line naming the file and what
is wrong, in every tool that loads one (the runner's loads through mmengine's
``CheckpointLoader``, ``Pretrained``, ``tools/test.py``, the converters, ``extract_backbone.py``);
``--resume`` from a damaged last checkpoint names the last good one and the command to resume
from it, and changes nothing on disk."""
import os
import os.path as osp
import re
import shlex
import pytest
import torch
from mmengine.runner.checkpoint import CheckpointLoader
from repo_files import REPO, load_file

from mmdinomamba.models.utils import (CheckpointFileError, checkpoint_file_problem,
                                      load_backbone_checkpoint, read_checkpoint)

DEMO_CFG = osp.join(REPO, 'configs/pretrain/dino_dinovim-demo_1xb32-14e_embedded-64px.py')


def _checkpoint(path, value=1.0):
    torch.save({'state_dict': {'w': torch.full((64, 64), value)}, 'meta': {'epoch': 1}}, path)
    return str(path)


def _truncated(path):
    _checkpoint(path)
    data = open(path, 'rb').read()
    with open(path, 'wb') as f:
        f.write(data[:len(data) // 2])
    return str(path)


def _config_file(path):
    path.write_text("# a config\n_base_ = ['../_base_/x.py']\nmodel = dict(type='X')\n")
    return str(path)


@pytest.fixture
def bad_files(tmp_path):
    (tmp_path / 'empty.pth').write_bytes(b'')
    (tmp_path / 'notes.txt').write_text('epoch 3 looked good\n')
    import pickle
    (tmp_path / 'metrics.pkl').write_bytes(pickle.dumps({'auc': 0.5}))
    return {
        'truncated': (_truncated(tmp_path / 'cut.pth'), 'the file is truncated or damaged'),
        'config': (_config_file(tmp_path / 'cfg.pth'), 'it is a config (Python) file, not a '
                   "checkpoint (it begins with '# a config')"),
        'empty': (str(tmp_path / 'empty.pth'), 'the file is empty (0 bytes)'),
        'text': (str(tmp_path / 'notes.txt'), 'it is a text file, not a checkpoint'),
        'pickle': (str(tmp_path / 'metrics.pkl'), 'it is a pickle file, not a PyTorch'),
    }


def test_the_problem_of_each_file_is_named(bad_files, tmp_path):
    assert checkpoint_file_problem(_checkpoint(tmp_path / 'good.pth')) is None
    for path, problem in bad_files.values():
        assert checkpoint_file_problem(path).startswith(problem), path
        with pytest.raises(CheckpointFileError) as err:
            read_checkpoint(path)
        assert str(err.value).startswith(f'cannot load the checkpoint {path}: {problem}')
        assert '\n' not in str(err.value)


def test_mmengine_loads_and_pretrained_go_through_the_loader(bad_files):
    path, problem = bad_files['truncated']
    with pytest.raises(CheckpointFileError, match=re.escape(problem)):
        CheckpointLoader.load_checkpoint(path, map_location='cpu')  # resume, load_from
    path, problem = bad_files['config']
    with pytest.raises(CheckpointFileError, match=re.escape(problem)):
        load_backbone_checkpoint(torch.nn.Linear(2, 2), path)  # a Pretrained init_cfg


@pytest.mark.parametrize('tool', ['dinomamba2mmdm', 'dino_vit2mmdm', 'extract_backbone'])
@pytest.mark.parametrize('kind', ['truncated', 'config'])
def test_converters_name_the_file(tool, kind, bad_files, tmp_path, capsys):
    path, problem = bad_files[kind]
    out = str(tmp_path / 'out.pth')
    module = load_file(f'tools/model_converters/{tool}.py')
    try:
        code = module.main([path, out])
    except SystemExit as exc:
        code, message = 1, str(exc.code)
    else:
        message = capsys.readouterr().err
    assert code == 1
    assert message.strip().splitlines()[0].startswith(
        f'error: cannot load the checkpoint {path}: {problem}')
    assert not osp.exists(out)


def test_test_tool_names_the_file(bad_files, tmp_path):
    path, problem = bad_files['truncated']
    test = load_file('tools/test.py')
    with pytest.raises(SystemExit,
                       match=re.escape(f'error: cannot load the checkpoint {path}: {problem}')):
        test.main([osp.join(REPO, 'configs/analysis/binary-auc_dinovim-demo_embedded.py'), path,
                   '--work-dir', str(tmp_path / 'w')])
    assert not (tmp_path / 'w').exists()


def _snapshot(folder):
    stats = {f: os.stat(osp.join(folder, f)) for f in os.listdir(folder)}
    return sorted((f, s.st_size, s.st_mtime_ns) for f, s in stats.items())


def test_resume_from_a_damaged_last_checkpoint_names_the_last_good_one(tmp_path):
    work = tmp_path / 'run'
    work.mkdir()
    good = _checkpoint(work / 'epoch_1.pth')
    os.utime(good, (1, 1))  # older
    damaged = _truncated(work / 'epoch_2.pth')
    (work / 'last_checkpoint').write_text(damaged)
    before = _snapshot(work)
    train = load_file('tools/train.py')
    argv = [DEMO_CFG, '--work-dir', str(work), '--resume']
    with pytest.raises(SystemExit) as exc:
        train.main(argv)
    lines = str(exc.value.code).splitlines()
    assert lines[0].startswith(f'--resume: cannot resume from {damaged}: the file is truncated')
    assert lines[1] == f'The last good checkpoint is {good}; resume from it with:'
    command = shlex.split(lines[2])
    script = osp.relpath(osp.join(REPO, 'tools/train.py'))
    script = osp.join(REPO, 'tools/train.py') if script.startswith('..') else script
    assert command[:2] == ['python', script]
    assert command[2:] == [DEMO_CFG, '--work-dir', str(work), '--resume', good]
    assert lines[-1] == 'Nothing was changed on disk.'
    assert _snapshot(work) == before
    # an explicit path is refused the same way; without a good one, the message says so
    os.remove(good)
    with pytest.raises(SystemExit, match='There is no other complete checkpoint next to it'):
        train.main([DEMO_CFG, '--work-dir', str(work), '--resume', damaged])


def test_demo_names_a_damaged_checkpoint(bad_files, tmp_path, monkeypatch):
    path, problem = bad_files['truncated']
    demo = load_file('tools/demo.py')
    # what the demo does with the checkpoint of its pretraining (build_backbone)
    monkeypatch.setattr(demo, 'demo', lambda args, wd: load_backbone_checkpoint(
        torch.nn.Linear(2, 2), path, prefix='teacher.backbone.'))
    with pytest.raises(SystemExit, match=re.escape(
            f'[demo] error: cannot load the checkpoint {path}: {problem}')):
        demo.main(['--work-dir', str(tmp_path / 'wd')])


def test_a_checkpoint_damaged_inside_names_the_last_good_one_too(tmp_path, monkeypatch):
    """Damage that only ``torch.load`` finds (the structure looks whole) is caught around the
    runner's resume, with the same message."""
    work = tmp_path / 'run'
    work.mkdir()
    good = _checkpoint(work / 'epoch_1.pth')
    os.utime(good, (1, 1))
    damaged = _checkpoint(work / 'epoch_2.pth')
    (work / 'last_checkpoint').write_text(damaged)
    train = load_file('tools/train.py')

    class Runner:
        def train(self):
            read_checkpoint(damaged)  # what Runner.resume does

    def failing_load(*args, **kwargs):
        raise RuntimeError('PytorchStreamReader failed reading file data/0: invalid header')

    monkeypatch.setattr('mmengine.runner.checkpoint._safe_torch_load', failing_load)
    monkeypatch.setattr(train.Runner, 'from_cfg', classmethod(lambda cls, cfg: Runner()))
    with pytest.raises(SystemExit) as exc:
        train.main([DEMO_CFG, '--work-dir', str(work), '--resume'])
    lines = str(exc.value.code).splitlines()
    assert lines[0] == (f'--resume: cannot resume from {damaged}: torch.load failed (' +
                        f'{os.path.getsize(damaged)} bytes; damaged or not a checkpoint): '
                        'RuntimeError: PytorchStreamReader failed reading file data/0: invalid '
                        'header')
    assert lines[1] == f'The last good checkpoint is {good}; resume from it with:'
