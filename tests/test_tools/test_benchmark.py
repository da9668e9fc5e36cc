"""tools/analysis/benchmark.py: one side-by-side CPU run, ratios to the ViT of the same size."""
import json

import pytest

from mmdinomamba.utils import bench_stats
from repo_files import load_file


def _tool():
    return load_file('tools/analysis/benchmark.py')


@pytest.mark.slow
def test_cpu_run_measures_the_reference_in_the_same_run(tmp_path, capsys):
    out = tmp_path / 'rows.json'
    _tool().main(['--device', 'cpu', '--archs', 'dinovim-t', '--res', '32', '--batch', '1',
                  '--modes', 'fwd', '--iters', '1', '--warmup', '0', '--recompute-merge', '--json',
                  str(out)])
    rows = {r['arch']: r for r in json.loads(out.read_text())}
    assert set(rows) == {'vit-s', 'dinovim-t'}  # the reference was added and measured
    assert rows['vit-s']['speed_ratio'] == 1.0
    d = rows['dinovim-t']
    assert d['imgs'] > 0 and d['speed_ratio'] == pytest.approx(d['imgs'] / rows['vit-s']['imgs'])
    assert abs(d['params'] - 10.71) < 0.01
    assert ('recompute_merge=True with_cp=False keep_freed_memory=False chunk_size=default'
            in capsys.readouterr().out)


def test_build_passes_the_mixer_options_to_mamba_mixers_only():
    tool = _tool()
    opts = tool.build_options(
        tool.parse_args(['--recompute-merge', '--with-cp', '--chunk-size', '64']))
    assert opts['mixer'] == dict(chunk_size=64, recompute_merge=True)
    model = tool._build('dinovim-t', 'cpu', opts)
    mixer = model.layers[0].mixer
    assert mixer.chunk_size == 64 and mixer.recompute_merge
    assert model.with_cp
    defaults = tool.build_options(tool.parse_args([]))
    assert defaults['mixer'] == {}
    model = tool._build('dinovim-t', 'cpu', defaults)
    mixer = model.layers[0].mixer
    assert not mixer.recompute_merge and mixer.chunk_size == 256
    assert not model.with_cp
    assert tool._build('vit-s', 'cpu', opts).with_cp  # not a Mamba model: mixer options ignored


def test_profile_prints_operators_and_writes_a_trace(tmp_path, capsys):
    trace = tmp_path / 'trace.json'
    _tool().main(['--device', 'cpu', '--batch', '1', '--iters', '1', '--warmup', '0',
                  '--profile', 'dinovim-t', '32', 'fwd+bwd', '--trace', str(trace)])
    table = capsys.readouterr().out
    assert 'Self CPU' in table and 'bidir_ssd' in table  # the mixer's op ran
    assert json.loads(trace.read_text())['traceEvents']
    with pytest.raises(SystemExit, match='mode'):
        _tool().main(['--device', 'cpu', '--profile', 'dinovim-t', '32', 'bwd'])


def test_one_reference_for_all(tmp_path):
    """--ref vit-b: the small model's ratio is taken against ViT-B, measured in the same run."""
    out = tmp_path / 'rows.json'
    load_file('tools/analysis/benchmark.py').main([
        '--device', 'cpu', '--archs', 'dinovim-t', '--ref', 'vit-b', '--res', '32', '--batch',
        '1', '--modes', 'fwd', '--iters', '1', '--warmup', '0', '--json', str(out)])
    rows = {r['arch']: r for r in json.loads(out.read_text())}
    assert set(rows) == {'vit-b', 'dinovim-t'} and rows['dinovim-t']['ref'] == 'vit-b'
    assert rows['dinovim-t']['speed_ratio'] == pytest.approx(rows['dinovim-t']['imgs'] /
                                                             rows['vit-b']['imgs'])


def test_rounds_alternate_the_models_and_keep_each_ones_best(tmp_path, monkeypatch):
    """--rounds 3: every model is measured three times, in turn, and the ratio is taken between
    the best runs; the peak is the highest of the rounds."""
    tool, calls = _tool(), []
    speeds = {'vit-s': iter([10.0, 4.0, 8.0]), 'dinovim-t': iter([3.0, 5.0, 2.0])}

    def fake_case(args, name, res, mode):
        calls.append(name)
        return dict(imgs=next(speeds[name]), mem=100.0 + len(calls), mem_total=float('nan'),
                    params=1.0, batch=1)

    monkeypatch.setattr(tool, '_run_case', fake_case)
    out = tmp_path / 'rows.json'
    tool.main(['--device', 'cpu', '--archs', 'dinovim-t', '--res', '32', '--modes', 'fwd',
               '--rounds', '3', '--json', str(out)])
    assert calls == ['vit-s', 'dinovim-t'] * 3
    rows = {r['arch']: r for r in json.loads(out.read_text())}
    assert rows['vit-s']['imgs'] == 10.0 and rows['dinovim-t']['imgs'] == 5.0
    assert rows['dinovim-t']['speed_ratio'] == 0.5
    assert rows['dinovim-t']['imgs_runs'] == [3.0, 5.0, 2.0]
    assert rows['dinovim-t']['mem'] == 106.0  # the last (highest) of its three peaks
    with pytest.raises(SystemExit, match='--rounds must be >= 1'):
        tool.main(['--device', 'cpu', '--archs', 'dinovim-t', '--rounds', '0'])


def test_interleave_takes_the_median_of_the_rounds_ratios(tmp_path, monkeypatch, capsys):
    """--interleave 3: the models run in turn in one process, three rounds; the speed ratio is
    the median of the rounds' ratios (the separate processes' ratio is kept beside it), memory
    stays that of the separate processes."""
    tool = _tool()
    monkeypatch.setattr(tool, '_run_case', lambda args, name, res, mode: dict(
        imgs={'vit-s': 10.0, 'dinovim-t': 4.0}[name], mem=100.0, mem_total=float('nan'),
        params=1.0, batch=1))
    calls = []

    def fake_interleaved(args, names, res, mode):
        calls.append((tuple(names), res, mode, args.interleave))
        # step times (s) per round: ratios 2/4, 1/1, 3/2 -> median 1.0
        return {'vit-s': [2.0, 1.0, 3.0], 'dinovim-t': [4.0, 1.0, 2.0]}

    monkeypatch.setattr(tool, 'interleaved', fake_interleaved)
    out = tmp_path / 'rows.json'
    tool.main(['--device', 'cpu', '--archs', 'dinovim-t', '--res', '32', '--modes', 'fwd',
               '--interleave', '3', '--json', str(out)])
    assert calls == [(('vit-s', 'dinovim-t'), 32, 'fwd', 3)]
    rows = {r['arch']: r for r in json.loads(out.read_text())}
    d = rows['dinovim-t']
    assert d['speed_ratio'] == 1.0 and d['speed_ratio_rounds'] == [0.5, 1.0, 1.5]
    assert d['speed_ratio_processes'] == 0.4 and d['mem_ratio'] == 1.0
    assert rows['vit-s']['speed_ratio'] == 1.0
    table = capsys.readouterr().out
    assert 'interleave=3' in table and '0.50-1.50' in table and 'median of the interleaved' in table
    assert d['speed_ratio_ci'] is None  # too few rounds for a 95% interval
    with pytest.raises(SystemExit, match='--interleave must be >= 0'):
        tool.main(['--device', 'cpu', '--archs', 'dinovim-t', '--interleave', '-1'])


def test_interleave_is_skipped_when_a_model_ran_out_of_memory(tmp_path, monkeypatch, capsys):
    """A case whose separate processes ran out of memory (nan) keeps the processes' ratio and
    says why on stderr, instead of building every model in one process."""
    tool = _tool()
    monkeypatch.setattr(tool, '_run_case', lambda args, name, res, mode: dict(
        imgs={'vit-s': 10.0, 'dinovim-t': float('nan')}[name], mem=100.0,
        mem_total=float('nan'), params=1.0, batch=1))
    monkeypatch.setattr(tool, 'interleaved', lambda *a: pytest.fail('interleaved ran'))
    out = tmp_path / 'rows.json'
    tool.main(['--device', 'cpu', '--archs', 'dinovim-t', '--res', '32', '--modes', 'fwd',
               '--interleave', '3', '--json', str(out)])
    rows = {r['arch']: r for r in json.loads(out.read_text())}
    assert 'speed_ratio_rounds' not in rows['dinovim-t']
    assert '--interleave skipped: a model ran out of memory' in capsys.readouterr().err


@pytest.mark.slow
def test_interleaved_rounds_time_every_model_in_one_process():
    """The interleaved rounds themselves: one median step time per model and round, from
    models set up as the separate processes set them up."""
    tool = _tool()
    args = tool.parse_args(['--device', 'cpu', '--batch', '1', '--iters', '2', '--warmup', '1',
                            '--interleave', '2'])
    times = tool.interleaved(args, ['vit-s', 'dinovim-t'], 32, 'fwd+bwd')
    assert set(times) == {'vit-s', 'dinovim-t'}
    assert all(len(t) == 2 and all(s > 0 for s in t) for t in times.values())
    ratio = bench_stats.paired_ratio(times, 'dinovim-t', 'vit-s')
    assert ratio['speed_ratio_rounds'] == [r / t for r, t in zip(times['vit-s'],
                                                                  times['dinovim-t'])]


def test_interleaved_rounds_reverse_their_order_every_other_round(monkeypatch):
    """No model always runs first: the rounds go A B C, C B A, A B C, ..., and each model's
    times stay in round order whatever its place in the round."""
    tool, seen = _tool(), []
    monkeypatch.setattr(tool, '_setup', lambda name, *a: (name, None, None))

    def fake_median_step(model, optim, x, mode, device, iters, amp):
        seen.append(model)
        return len(seen)  # the call's place in the whole sequence

    monkeypatch.setattr(tool, '_median_step', fake_median_step)
    monkeypatch.setattr(tool, '_step', lambda *a: None)
    args = tool.parse_args(['--device', 'cpu', '--iters', '1', '--warmup', '0',
                            '--interleave', '3'])
    times = tool.interleaved(args, ['a', 'b', 'c'], 32, 'fwd')
    assert seen == ['a', 'b', 'c', 'c', 'b', 'a', 'a', 'b', 'c']
    assert times == {'a': [1, 6, 7], 'b': [2, 5, 8], 'c': [3, 4, 9]}


def test_interleaved_table_shows_the_interval_of_the_median(tmp_path, monkeypatch, capsys):
    """With 9 rounds the table shows the median ratio's interval (the 2nd and 8th of the sorted
    ratios) beside the rounds' range: one slow round does not pull it below 1."""
    tool = _tool()
    monkeypatch.setattr(tool, '_run_case', lambda args, name, res, mode: dict(
        imgs=5.0, mem=100.0, mem_total=float('nan'), params=1.0, batch=1))
    ratios = [1.1, 1.2, 0.9, 1.05, 1.15, 1.3, 1.08, 1.12, 1.02]
    monkeypatch.setattr(tool, 'interleaved', lambda args, names, res, mode: {
        'vit-s': ratios, 'dinovim-t': [1.0] * 9})
    out = tmp_path / 'rows.json'
    tool.main(['--device', 'cpu', '--archs', 'dinovim-t', '--res', '32', '--modes', 'fwd',
               '--interleave', '9', '--json', str(out)])
    d = {r['arch']: r for r in json.loads(out.read_text())}['dinovim-t']
    assert d['speed_ratio_ci'] == [1.02, 1.2] and d['speed_ratio'] == 1.1
    row = next(line for line in capsys.readouterr().out.splitlines() if 'dinovim-t' in line)
    assert row.split()[-3:] == ['1.02-1.20', '0.90-1.30', '1.00']


def test_breakdown_times_the_mixer_pieces_inside_whole_steps(capsys):
    """--breakdown: the ops' named ranges read from the profiler during whole steps; the
    nested pieces fit inside the mixer's time."""
    _tool().main(['--device', 'cpu', '--batch', '2', '--iters', '1', '--warmup', '0',
                  '--breakdown', 'dinovim-t', '32', 'fwd+bwd'])
    lines = capsys.readouterr().out.splitlines()[2:]
    rows = {line[:50].strip(): float(line[50:60]) for line in lines}
    mixer = rows['mixer between its projections, forward'] + rows[
        'mixer between its projections, backward']
    assert 0 < rows['SSD scan, forward and backward'] < mixer
    # the factored products, fused or not, inside the scan
    assert 0 < rows['(L, L) products and the work fused with them'] < rows[
        'SSD scan, forward and backward']
    assert 0 < rows["both directions' convs + SiLU"] < mixer
    assert 0 < rows['gated RMSNorms and their average'] < mixer
    assert rows['rest: projections, norms, residuals, other layers'] > 0
    with pytest.raises(SystemExit, match='not one of'):
        _tool().main(['--device', 'cpu', '--breakdown', 'dinovim-t', '32', 'sideways'])


def test_breakdown_says_when_the_fast_path_did_not_run(capsys):
    _tool().main(['--device', 'cpu', '--batch', '1', '--iters', '1', '--warmup', '0',
                  '--breakdown', 'vit-s', '32', 'fwd'])
    assert 'did not run' in capsys.readouterr().out
