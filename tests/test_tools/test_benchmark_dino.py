"""tools/analysis/benchmark_dino.py: DINO's whole step (tiny arch and crops) runs on CPU next to
its ViT peer and prints img/s and the ratio."""
import pytest
from repo_files import load_file


def _tool():
    return load_file('tools/analysis/benchmark_dino.py')


def test_tiny_dino_step_next_to_its_vit_peer(capsys):
    rows = _tool().main(['--archs', 'dinovim-t', '--device', 'cpu', '--batch', '2', '--res',
                         '32', '--local-res', '16', '--local-crops', '2', '--iters', '1',
                         '--warmup', '1', '--rounds', '2', '--width', '32', '--depth', '1',
                         '--out-dim', '64', '--hidden-dim', '32', '--bottleneck-dim', '16'])
    out = capsys.readouterr().out
    assert 'DINO step: 2 x 32 + 2 x 16 px, batch 2' in out
    assert [r['arch'] for r in rows] == ['dinovim-t', 'vit-s']
    ours, peer = rows
    assert ours['peer'] == 'vit-s' and ours['ratio'] > 0 and peer['ratio'] is None
    assert ours['imgs'] > 0 and peer['imgs'] > 0
    assert 'dinovim-t' in out and '(vit-s)' in out


def test_one_step_trains_student_and_teacher():
    import torch
    tool = _tool()
    args = tool.parse_args(['--archs', 'vit-s', '--device', 'cpu', '--batch', '2', '--res',
                            '32', '--local-res', '16', '--local-crops', '1', '--width', '64',
                            '--depth', '1', '--out-dim', '32', '--hidden-dim', '16',
                            '--bottleneck-dim', '8'])
    step, model, wrapper = tool.build_step('vit-s', args, 'cpu')
    before = [p.detach().clone() for p in model.teacher.parameters()]
    s_before = [p.detach().clone() for p in model.backbone.parameters()]
    step(0)
    assert any(not torch.equal(a, p) for a, p in zip(s_before, model.backbone.parameters()))
    assert any(not torch.equal(a, p) for a, p in zip(before, model.teacher.parameters()))
    assert wrapper.pending_scalars == []  # the norm was dropped, never read


def test_bad_options_are_named():
    with pytest.raises(SystemExit):
        _tool().parse_args(['--batch', '0'])
