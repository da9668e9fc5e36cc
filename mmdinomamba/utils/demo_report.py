"""The demo report: DINO loss curve and collapse signals, Binary-AUC per layer, probe accuracy.

Pure functions over what the OpenMMLab tools write (mmengine's ``vis_data/scalars.json`` lines,
``tools/test.py --out`` metric dicts), so the report is tested without running anything.
"""
import math
import os.path as osp
import re
from typing import Dict, List, Optional, Sequence

COLLAPSE_KEYS = ('teacher_entropy', 'kl', 'center_norm', 'teacher_temp', 'momentum')


def _series(scalars: Sequence[dict], key: str) -> List[float]:
    """Values of ``key`` (or of any key ending in ``/key``) in logged order."""
    out = []
    for row in scalars:
        for k, v in row.items():
            if (k == key or k.endswith('/' + key)) and isinstance(v, (int, float)):
                out.append(float(v))
                break
    return out


def summarize_curve(values: Sequence[float], window: int = 5) -> Optional[dict]:
    """First/last window means, min, max and whether the curve fell (last < first).

    Returns None for an empty series. ``finite`` is False when any value is NaN or inf.
    """
    if not values:
        return None
    w = max(1, min(window, len(values) // 2 or 1))
    first = sum(values[:w]) / w
    last = sum(values[-w:]) / w
    return dict(n=len(values), first=first, last=last, min=min(values), max=max(values),
                fell=last < first, finite=all(math.isfinite(v) for v in values))


def auc_by_layer(metrics: Dict[str, float], name: str = 'auc') -> Dict[int, float]:
    """``{layer: value}`` from a BinaryAUC metric dict (keys ``[prefix/]<name>/layer_<i>``)."""
    pat = re.compile(rf'(?:^|/){re.escape(name)}/layer_(-?\d+)$')
    out = {}
    for k, v in metrics.items():
        m = pat.search(k)
        if m:
            out[int(m.group(1))] = float(v)
    return dict(sorted(out.items()))


def probe_accuracy(scalars: Sequence[dict]) -> Optional[dict]:
    """Last and best top-1 accuracy of the validation rows (``accuracy/top1``)."""
    acc = [float(r[k]) for r in scalars for k in r if k.endswith('accuracy/top1')]
    if not acc:
        return None
    return dict(last=acc[-1], best=max(acc), evaluations=len(acc))


def _fmt(v, spec='.3f'):
    return '-' if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def _pretrain_section(pretrain_config: str, scalars: Sequence[dict]) -> List[str]:
    lines = ['## DINO pretraining', '', f'Config: `{pretrain_config}`', '',
             '| signal | iterations logged | first | last | min | max |',
             '|---|---|---|---|---|---|']
    loss = summarize_curve(_series(scalars, 'loss'))
    for key in ('loss', ) + COLLAPSE_KEYS:
        s = summarize_curve(_series(scalars, key))
        if s:
            lines.append(f'| {key} | {s["n"]} | {_fmt(s["first"])} | {_fmt(s["last"])} | '
                         f'{_fmt(s["min"])} | {_fmt(s["max"])} |')
    lines.append('')
    if loss is None:
        lines.append('No loss was logged.')
    else:
        verdict = 'fell' if loss['fell'] else 'did NOT fall'
        lines.append(f'The loss {verdict} ({_fmt(loss["first"])} -> {_fmt(loss["last"])}, mean of '
                     'the first/last logged iterations); all values finite: '
                     f'{"yes" if loss["finite"] else "NO"}.')
    return lines


def _auc_section(aucs: Dict[str, dict]) -> List[str]:
    tags = list(aucs)
    per = {t: auc_by_layer(aucs[t]) for t in tags}
    norm = {t: auc_by_layer(aucs[t], 'auc_norm') for t in tags}
    layers = sorted(set().union(*[set(p) for p in per.values()])) if per else []
    head = ' | '.join(f'{t} AUC | {t} max(AUC,100-AUC)' for t in tags)
    lines = ['## Binary-AUC (CLS-to-patch maps vs foreground masks, val split, %)', '',
             f'| layer | {head} |', '|---' * (1 + 2 * len(tags)) + '|']
    for layer in layers:
        cells = ' | '.join(f'{_fmt(per[t].get(layer), ".1f")} | {_fmt(norm[t].get(layer), ".1f")}'
                           for t in tags)
        lines.append(f'| {layer} | {cells} |')
    overall = ' | '.join(
        f'{_fmt(_metric(aucs[t], "auc"), ".1f")} | {_fmt(_metric(aucs[t], "auc_norm"), ".1f")}'
        for t in tags)
    lines += [f'| mean | {overall} |', '',
              '50 = chance. The normalized column folds inverted maps (AUC < 50) onto > 50, so it '
              'is above 50 even for random maps; compare it between rows, not with 50.']
    return lines


def _metric(metrics: dict, name: str):
    for k, v in metrics.items():
        if k == name or k.endswith('/' + name):
            return float(v)
    return None


def write_report(work_dir: str, pretrain_config: str, scalars: Sequence[dict],
                 aucs: Dict[str, dict], probes: Dict[str, Sequence[dict]],
                 figures: Sequence[str] = (), times: Optional[Dict[str, float]] = None,
                 total: Optional[float] = None) -> str:
    """Write ``<work_dir>/report.md`` and return its text."""
    lines = ['# mmdinomamba demo report', '']
    lines += _pretrain_section(pretrain_config, scalars) + ['']
    lines += _auc_section(aucs) + ['']
    if figures:
        lines += ['Feature-map figures: ' + ', '.join(f'`{osp.relpath(f, work_dir)}`'
                                                      for f in figures), '']
    lines += ['## Linear probe on the embedded labels (6 classes, chance 16.7%)', '',
              '| backbone | last top-1 | best top-1 | evaluations |', '|---|---|---|---|']
    for tag, rows in probes.items():
        acc = probe_accuracy(rows)
        if acc is None:
            lines.append(f'| {tag} | - | - | 0 |')
        else:
            lines.append(f'| {tag} | {acc["last"]:.2f} | {acc["best"]:.2f} | '
                         f'{acc["evaluations"]} |')
    if times:
        lines += ['', '## Wall time (s)', '', '| step | seconds |', '|---|---|']
        lines += [f'| {k} | {v:.0f} |' for k, v in times.items()]
        if total is not None:
            lines.append(f'| total | {total:.0f} |')
    text = '\n'.join(lines) + '\n'
    with open(osp.join(work_dir, 'report.md'), 'w') as f:
        f.write(text)
    return text
