"""Tables, CSV, the hierarchy check and plots of the block-rank analysis (paper Eq. 16-17).

Inputs are the per-block records of :func:`mmdinomamba.analysis.rank_model.analyze_layer`
(one dict per model, layer, image, head, view, matrix and block).
"""
import csv
import os
import os.path as osp
from collections import defaultdict
from typing import Dict, List, Sequence

import numpy as np

from .rank import AS_USED, CAUSAL

__all__ = ['aggregate', 'write_csv', 'format_table', 'hierarchy_lines', 'plot_rank_per_layer',
           'plot_spectra']

GROUP_KEYS = ('model', 'mixer', 'matrix', 'view', 'layer', 'block')
CONST_KEYS = ('C', 'd_qk', 'd_state', 'rel_tol', 'abs_tol', 'dropped')


def aggregate(records: Sequence[dict]) -> List[dict]:
    """Mean / min / max of ``rank``, ``rank_abs`` and ``erank`` per model, mixer, matrix, view,
    layer and block kind (over images, heads and blocks of that kind)."""
    groups: Dict[tuple, List[dict]] = defaultdict(list)
    for r in records:
        groups[tuple(r[k] for k in GROUP_KEYS)].append(r)
    rows = []
    for key, recs in groups.items():
        row = dict(zip(GROUP_KEYS, key), n=len(recs))
        for col in ('rank', 'rank_abs', 'erank', 'bound'):
            v = np.array([r[col] for r in recs], dtype=np.float64)
            row.update({f'{col}_mean': float(v.mean()), f'{col}_min': float(v.min()),
                        f'{col}_max': float(v.max())})
        row.update({k: recs[0].get(k) for k in CONST_KEYS})
        rows.append(row)
    return rows


def write_csv(rows: Sequence[dict], path: str) -> None:
    """Write dict rows (columns = keys of the first row) to ``path``."""
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    with open(path, 'w', newline='') as f:
        if not rows:
            return
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def format_table(table: Sequence[dict], args=None) -> str:
    """A fixed-width text table, one line per model / matrix / view / layer / block kind."""
    lines = []
    if args is not None:
        lines.append(f'C={args.block_size}, rank: s > {args.rel_tol:g} * s_max (float64 SVD); '
                     f'rank_abs: s > {args.abs_tol:g}; erank: exp(entropy of s/sum s); '
                     f'tokens: patches only (cls/registers dropped), ragged rows/cols dropped')
    lines.append(f'{"model":<16}{"mixer":<8}{"mat":<4}{"view":<25}{"layer":>5} {"block":<6}'
                 f'{"rank mean [min,max]":>22}{"rank_abs":>9}{"erank mean [min,max]":>24}'
                 f'{"bound":>8}')
    for r in sorted(table, key=lambda r: (r['model'], r['matrix'], r['view'], r['layer'],
                                          r['block'])):
        lines.append(
            f'{r["model"]:<16}{r["mixer"]:<8}{r["matrix"]:<4}{r["view"]:<25}{r["layer"]:>5} '
            f'{r["block"]:<6}{r["rank_mean"]:>10.1f} [{r["rank_min"]:>3.0f},{r["rank_max"]:>4.0f}]'
            f'{r["rank_abs_mean"]:>9.1f}{r["erank_mean"]:>10.1f} [{r["erank_min"]:>5.1f},'
            f'{r["erank_max"]:>6.1f}]{r["bound_mean"]:>8.1f}')
    return '\n'.join(lines)


def _pooled(table, mixer: str, matrix: str, view: str, blocks=('lower', )) -> dict:
    rows = [r for r in table if r['mixer'] == mixer and r['matrix'] == matrix
            and r['view'] == view and r['block'] in blocks]
    if not rows:
        return {}
    w = np.array([r['n'] for r in rows], dtype=np.float64)
    out = {c: float(np.average([r[f'{c}_mean'] for r in rows], weights=w))
           for c in ('rank', 'erank', 'bound')}
    out.update(d_qk=rows[0]['d_qk'], d_state=rows[0]['d_state'])
    return out


def hierarchy_lines(table: Sequence[dict], block_size: int) -> List[str]:
    """The paper's Eq. 17 check: bounds C > rank(L_M^off) * N > D_QK, and the measured
    off-diagonal ranks softmax > mamba > linear (causal view, lower blocks, pooled means)."""
    sm, mb, la = (_pooled(table, k, 'M', CAUSAL) for k in ('softmax', 'mamba', 'linear'))
    lm = _pooled(table, 'mamba', 'L_M', CAUSAL)
    lines = [f'Hierarchy check ({CAUSAL}, lower off-diagonal blocks, means over layers/heads/'
             f'images/blocks; C = {block_size}):']
    if mb and lm and la:
        bm, bl = mb['bound'], float(min(block_size, la['d_qk']))
        ok = block_size > bm > bl
        lines.append(f'  bounds: C = {block_size} > rank(L_M^off) * N = {lm["rank"]:.2f} * '
                     f'{mb["d_state"]} = {bm:.1f} > D_QK = {bl:.0f}: '
                     f'{"HOLDS" if ok else "DOES NOT HOLD"}')
    if sm and mb and la:
        for col, label in (('rank', 'numerical rank'), ('erank', 'effective rank')):
            a, b, c = sm[col], mb[col], la[col]
            ok = a > b > c
            lines.append(f'  measured {label}: softmax {a:.1f} > mamba {b:.1f} > linear {c:.1f}: '
                         f'{"HOLDS" if ok else "DOES NOT HOLD"}')
    if len(lines) == 1:
        lines.append('  (needs softmax, linear and mamba models in one run)')
    return lines


def _figure(nrows: int, ncols: int, size=(5.0, 3.6)):
    from matplotlib.figure import Figure
    fig = Figure(figsize=(size[0] * ncols, size[1] * nrows), layout='constrained')
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def plot_rank_per_layer(table: Sequence[dict], out_file: str) -> None:
    """Rank / effective rank of M's off-diagonal blocks per layer, one line per model.

    Rows: the two views; off-diagonal = lower blocks (causal) or lower + upper (as used).
    """
    fig, axes = _figure(2, 2)
    for vi, (view, blocks) in enumerate(((CAUSAL, ('lower', )), (AS_USED, ('lower', 'upper')))):
        for ci, col in enumerate(('rank', 'erank')):
            ax = axes[vi, ci]
            for model in sorted({r['model'] for r in table}):
                rows = [r for r in table if r['model'] == model and r['matrix'] == 'M'
                        and r['view'] == view and r['block'] in blocks]
                layers = sorted({r['layer'] for r in rows})
                if not layers:
                    continue
                mean = [np.average([r[f'{col}_mean'] for r in rows if r['layer'] == i],
                                   weights=[r['n'] for r in rows if r['layer'] == i])
                        for i in layers]
                lo = [min(r[f'{col}_min'] for r in rows if r['layer'] == i) for i in layers]
                hi = [max(r[f'{col}_max'] for r in rows if r['layer'] == i) for i in layers]
                line, = ax.plot(layers, mean, marker='o', label=f'{model} ({rows[0]["mixer"]})')
                ax.fill_between(layers, lo, hi, color=line.get_color(), alpha=0.15)
            ax.set(title=f'{"numerical" if col == "rank" else "effective"} rank, {view}',
                   xlabel='layer', ylabel=f'off-diagonal {col}')
            ax.legend(fontsize=7)
    _save(fig, out_file)


def plot_spectra(spectra: dict, out_file: str, block_size: int) -> None:
    """Normalized singular values ``s / s_max`` of block (1, 0) at each model's last analyzed
    layer (median over heads and images), per view; dashed: Mamba's ``L_M``."""
    fig, axes = _figure(1, 2)
    last = {}
    for (model, layer, *_rest) in spectra:
        last[model] = max(layer, last.get(model, -1))
    for vi, view in enumerate((CAUSAL, AS_USED)):
        ax = axes[0, vi]
        for (model, layer, matrix, v), sv in sorted(spectra.items()):
            if v != view or layer != last[model]:
                continue
            s = sv.double() / sv[..., :1].double().clamp_min(1e-300)
            med = np.clip(s.median(dim=0).values.numpy(), 1e-18, None)
            ax.semilogy(np.arange(1, med.size + 1), med, ls='--' if matrix == 'L_M' else '-',
                        label=f'{model} {matrix} (layer {layer})')
        ax.set(title=f'block (1,0) spectrum, {view}', xlabel='index', ylabel='s / s_max',
               xlim=(1, block_size), ylim=(1e-18, 2))
        ax.legend(fontsize=7)
    _save(fig, out_file)


def _save(fig, out_file: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    os.makedirs(osp.dirname(osp.abspath(out_file)), exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(out_file, dpi=110)
