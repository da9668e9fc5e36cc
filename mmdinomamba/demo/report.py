"""The demo's ``summary.json`` and ``report.md``: pure functions of what the run measured.

Inputs are the per-iteration scalars mmengine logged during pretraining (``vis_data/scalars.json``
lines) and the evaluation results of :func:`mmdinomamba.demo.evaluate.evaluate_backbone` for the
teacher and for every random-init seed, so both files are tested without running anything.
"""
import json
import math
import os.path as osp
import re
import statistics
from typing import Dict, List, Optional, Sequence

__all__ = ['series', 'auc_by_layer', 'auc_during_training', 'build_summary', 'write_summary',
           'render_report', 'verdict', 'TRAIN_KEYS', 'AT_CHANCE', 'random_vs_chance',
           'at_chance_note']

#: the training signals the report shows (DINO's logged scalars)
TRAIN_KEYS = ('loss', 'teacher_entropy', 'teacher_batch_entropy', 'prototypes_used', 'kl',
              'teacher_temp', 'momentum', 'lr')


def _step(row: dict) -> Optional[int]:
    for key in ('iter', 'step'):
        if isinstance(row.get(key), (int, float)):
            return int(row[key])
    return None


def series(scalars: Sequence[dict], key: str) -> List[tuple]:
    """``[(iteration, value)]`` of ``key`` (or any key ending in ``/key``), in logged order."""
    out = []
    for row in scalars:
        for k, v in row.items():
            if (k == key or k.endswith('/' + key)) and isinstance(v, (int, float)):
                out.append((_step(row), float(v)))
                break
    return out


_LAYER = re.compile(r'(?:^|/)auc/layer_(-?\d+)$')
_HEAD = re.compile(r'(?:^|/)auc/head_(\d+)$')


def auc_by_head(metrics: Optional[Dict[str, float]]) -> Dict[int, float]:
    """``{head: raw AUC %}`` of a :class:`BinaryAUC` metric dict of one layer's per-head maps;
    empty without per-head keys."""
    return dict(sorted((int(m.group(1)), float(v)) for k, v in (metrics or {}).items()
                       if (m := _HEAD.search(k))))


def auc_by_layer(metrics: Optional[Dict[str, float]]) -> Dict[int, float]:
    """``{layer: raw AUC %}`` of a :class:`BinaryAUC` metric dict; one entry (layer -1) for a
    single-layer evaluation."""
    if not metrics:
        return {}
    out = {int(m.group(1)): float(v) for k, v in metrics.items() if (m := _LAYER.search(k))}
    if not out:
        mean = _metric(metrics, 'auc')
        if mean is not None:
            out[-1] = mean
    return dict(sorted(out.items()))


def _metric(metrics: dict, name: str) -> Optional[float]:
    for k, v in metrics.items():
        if k == name or k.endswith('/' + name):
            return float(v)
    return None


def auc_during_training(scalars: Sequence[dict]) -> Dict[int, Dict[int, float]]:
    """``{iteration: {layer: AUC %}}`` from the Binary-AUC hook's logged rows."""
    out = {}
    for row in scalars:
        layers = auc_by_layer({k: v for k, v in row.items() if 'binary_auc' in k})
        if layers and _step(row) is not None:
            out[_step(row)] = layers
    return out


def _last(values: Sequence[tuple]) -> Optional[float]:
    return values[-1][1] if values else None


def _spread(values: Sequence[float]) -> str:
    if not values:
        return '-'
    mean = statistics.fmean(values)
    sd = statistics.pstdev(values) if len(values) > 1 else 0.
    return f'{mean:.1f} ± {sd:.1f} (min {min(values):.1f}, max {max(values):.1f})'


def _auc_mean(res: dict) -> float:
    return float(statistics.fmean(auc_by_layer(res['binary_auc']).values()))


def _auc_best(res: dict) -> float:
    return float(max(auc_by_layer(res['binary_auc']).values()))


#: the best random-init seed's k-NN below this multiple of chance: the untrained network does not
#: see the cue that tells the classes apart (measured: 1.0-1.1 x chance on the two sets of the
#: suite where DINO did not learn; 3.3-5.8 x on the strokes and colours sets, the embedded data and
#: the flags, where it gained 17-55 points)
AT_CHANCE = 1.5


def random_vs_chance(num_classes: int, random_knn: Sequence[float]) -> dict:
    """The best random-init seed's k-NN against chance (``at_chance``: below
    :data:`AT_CHANCE` x chance)."""
    chance, best = 100. / num_classes, max(random_knn)
    return dict(chance=round(chance, 2), best_random_knn=best, ratio=round(best / chance, 2),
                at_chance=bool(best < AT_CHANCE * chance))


def at_chance_note(summary: dict) -> Optional[str]:
    """The report's warning when random init classifies at chance, else None."""
    r = summary.get('random_vs_chance')
    if not r or not r['at_chance']:
        return None
    return (f'random init classifies at chance (best seed\'s k-NN {r["best_random_knn"]:.1f} = '
            f'{r["ratio"]:.2f} x chance {r["chance"]:.1f}%): the untrained network does not see '
            'the cue that tells these classes apart. On the two sets of the suite where this '
            'held (textures, shapes) no setting tried, an 8-layer backbone included, lifted '
            "DINO's k-NN off chance at the demo's budget; where random init was 3 x chance or "
            'more, DINO gained 17-55 points (docs/dino_small_scale.md, "What is short").')


def build_summary(teacher: dict, randoms: Sequence[dict], scalars: Sequence[dict],
                  num_classes: int, out_dim: int, wall_time_s: float,
                  supervised: Optional[dict] = None, collapse: Optional[dict] = None,
                  adapt: Optional[dict] = None) -> dict:
    """The machine-readable summary (keys documented in the README).

    Args:
        teacher (dict): evaluation of the DINO teacher. randoms: one per random-init seed.
        scalars (Sequence[dict]): the pretraining's logged rows.
        num_classes (int): classes of the data. out_dim (int): K, the DINO head's outputs.
        wall_time_s (float): the demo's wall time.
        supervised (dict, optional): evaluation of the supervised baseline; adds a
            ``supervised`` value next to ``teacher`` and ``random`` in every metric.
        collapse (dict, optional): the collapse record (:mod:`mmdinomamba.demo.collapse`)
            when the monitor stopped the pretraining: the ``collapse`` entry.
        adapt (dict, optional): the data's measurements and the settings derived from them.
    """
    def entry(fn):
        out = dict(teacher=fn(teacher), random=[fn(r) for r in randoms])
        if supervised is not None:
            out['supervised'] = fn(supervised)
        return out

    summary = dict(wall_time_s=round(wall_time_s, 1), num_classes=num_classes,
                   knn_top1=entry(lambda r: r['knn_top1']),
                   linear_top1=entry(lambda r: r['linear_top1']))
    summary['random_vs_chance'] = random_vs_chance(num_classes, summary['knn_top1']['random'])
    if teacher.get('binary_auc'):
        summary['binary_auc_mean'] = entry(_auc_mean)
        summary['binary_auc_best_layer'] = entry(_auc_best)
        summary['binary_auc_per_layer'] = entry(
            lambda r: {str(k): v for k, v in auc_by_layer(r['binary_auc']).items()})
        if auc_by_head(teacher.get('binary_auc_heads')):
            summary['binary_auc_last_layer_heads'] = entry(
                lambda r: {str(k): v for k, v in auc_by_head(r['binary_auc_heads']).items()})
    summary['teacher_batch_entropy'] = dict(
        final=_last(series(scalars, 'teacher_batch_entropy')), log_k=math.log(out_dim))
    used = _last(series(scalars, 'prototypes_used'))
    summary['prototypes_used'] = dict(final=None if used is None else round(used, 2), k=out_dim)
    if collapse:
        summary['collapse'] = {k: collapse[k] for k in (
            'kind', 'iteration', 'epoch', 'since_iteration', 'stopped_at_iteration', 'signals',
            'what_to_change', 'checkpoint') if k in collapse}
    if adapt:
        summary['data_settings'] = adapt
    return summary


def write_summary(path: str, summary: dict) -> None:
    with open(path, 'w') as f:
        json.dump(summary, f, indent=1)


def _margin_line(name: str, entry: dict, unit: str = 'points') -> str:
    best = max(entry['random'])
    sup = f' {entry["supervised"]:.1f} |' if 'supervised' in entry else ''
    return (f'| {name} | {entry["teacher"]:.1f} |{sup} {_spread(entry["random"])} | '
            f'{entry["teacher"] - best:+.1f} {unit} |')


_NAMES = (('knn_top1', 'k-NN top-1'), ('linear_top1', 'linear probe top-1'),
          ('binary_auc_mean', 'Binary-AUC mean over layers'),
          ('binary_auc_best_layer', 'Binary-AUC of the best layer'))


def verdict(summary: dict) -> List[str]:
    """One sentence per metric: which of DINO teacher, supervised and the best random seed
    comes out ahead, by how much."""
    out = []
    for key, name in _NAMES:
        e = summary.get(key)
        if not e or 'supervised' not in e:
            continue
        t, s, r = e['teacher'], e['supervised'], max(e['random'])
        who = 'DINO above supervised' if t > s else 'supervised above DINO' if s > t else \
            'DINO equal to supervised'
        out.append(f'- {name}: {who} ({t:.1f} vs {s:.1f}, {t - s:+.1f}); best random seed '
                   f'{r:.1f}.')
    return out


def _row(name: str, values: Sequence[float]) -> str:
    return f'| {name} | ' + ' | '.join(f'{v:.1f}' for v in values) + ' |'


def _per_layer_lines(summary: dict) -> List[str]:
    """Binary-AUC per layer and, for the last layer, per head (random: mean of seeds)."""
    out = []
    for key, what in (('binary_auc_per_layer', 'layer'),
                      ('binary_auc_last_layer_heads', 'head')):
        e = summary.get(key)
        if not e:
            continue
        cols = list(e['teacher'])
        title = 'layer' if what == 'layer' else 'head of the last layer'
        out += ['', f'Binary-AUC (raw, %) per {title}:', '',
                '| model | ' + ' | '.join(f'{what} {c}' for c in cols) + ' |',
                '|---' * (1 + len(cols)) + '|',
                _row('DINO teacher', [e['teacher'][c] for c in cols])]
        if 'supervised' in e:
            out.append(_row('supervised', [e['supervised'][c] for c in cols]))
        out.append(_row('random init (mean of seeds)',
                        [statistics.fmean(r[c] for r in e['random']) for c in cols]))
    return out


def _collapse_lines(c: dict) -> List[str]:
    sig = ', '.join(f'{k} {v:.4g}' for k, v in c.get('signals', {}).items())
    return ['## Collapse: pretraining stopped', '',
            f'The collapse monitor found a **{c["kind"]} collapse** of the teacher at '
            f'iteration {c["iteration"]} (epoch {c.get("epoch", "-")}; collapsed since '
            f'iteration {c.get("since_iteration", "-")}) and stopped the pretraining at '
            f'iteration {c.get("stopped_at_iteration", c["iteration"])}, its next read of the '
            'signals. The teacher of that iteration is evaluated below all the same; the demo '
            'exits with status 3.', '',
            f'- signals at the collapse: {sig}', f'- what to change: {c["what_to_change"]}', '']


def render_report(summary: dict, config: str, data_root: str, figures: Sequence[str],
                  times: Dict[str, float], notes: Sequence[str] = ()) -> str:
    """``report.md``: what was run, the numbers against random init (mean ± sd over seeds),
    the collapse signals and the figures."""
    n_seeds = len(summary['knn_top1']['random'])
    sup = 'supervised' in summary['knn_top1']
    lines = ['# mmdinomamba demo report', '',
             f'Pretraining config: `{config}`; data: `{data_root}` '
             f'({summary["num_classes"]} classes, chance {100 / summary["num_classes"]:.1f}%).',
             '']
    if summary.get('collapse'):
        lines += _collapse_lines(summary['collapse'])
    if summary.get('data_settings'):
        lines += ['## Settings derived from the data', '',
                  *[f'- {r}' for r in summary['data_settings']['reasons']], '']
    lines += [f'## Frozen features: DINO teacher{", supervised" if sup else ""} and random init '
              f'({n_seeds} seeds)', '',
             '| metric (%) | DINO teacher |' + (' supervised |' if sup else '') +
             ' random init: mean ± sd (min, max) | teacher - best random |',
             '|---|---|' + ('---|' if sup else '') + '---|---|',
             _margin_line('k-NN top-1 (k=20, T=0.07, cls token)', summary['knn_top1']),
             _margin_line('linear probe top-1 (L-BFGS logistic regression)',
                          summary['linear_top1'])]
    if 'binary_auc_mean' in summary:
        lines += [_margin_line('Binary-AUC, mean over layers (raw)', summary['binary_auc_mean']),
                  _margin_line('Binary-AUC, best layer (raw)', summary['binary_auc_best_layer'])]
        lines += _per_layer_lines(summary)
    else:
        lines += ['', 'Binary-AUC: skipped (the data folder has no `masks/`).']
    warn = at_chance_note(summary)
    if warn:
        lines += ['', f'**Note:** {warn}']
    if sup:
        lines += ['', 'Which way it comes out (DINO teacher vs the supervised baseline):', '',
                  *verdict(summary)]
    h, used = summary['teacher_batch_entropy'], summary['prototypes_used']
    lines += ['', '## Collapse signals at the end of pretraining', '',
              f'- batch-mean teacher entropy: {_fmt(h["final"])} nats of log K = '
              f'{h["log_k"]:.2f} ({_ratio(h["final"], h["log_k"])} x log K)',
              f'- prototypes in use (distinct argmax in a batch): {_fmt(used["final"], ".1f")} '
              f'of K = {used["k"]}', '']
    lines += [f'- {n}' for n in notes]
    if figures:
        lines += ['', '## Figures', ''] + [f'![{osp.basename(f)}]({f})' for f in figures]
    lines += ['', '## Wall time (s)', '', '| step | seconds |', '|---|---|']
    lines += [f'| {k} | {v:.0f} |' for k, v in times.items()]
    lines.append(f'| total | {summary["wall_time_s"]:.0f} |')
    return '\n'.join(lines) + '\n'


def _fmt(v, spec='.2f'):
    return '-' if v is None else format(v, spec)


def _ratio(a, b):
    return '-' if a is None else f'{a / b:.2f}'
