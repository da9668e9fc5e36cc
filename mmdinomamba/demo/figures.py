"""The demo's PNG figures (at least 800 px wide, labelled axes), with matplotlib's object API
and the Agg canvas (no pyplot, no global backend switch).

Every function writes one PNG and returns its path.
"""
import os.path as osp
import statistics
from typing import Dict, Optional, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from mmdinomamba.analysis import plots
from .report import auc_by_layer, series

__all__ = ['training_curves', 'auc_during_training_figure', 'auc_per_layer_figure',
           'maps_figure', 'heads_figure', 'pca_figure', 'mixers_figure']

DPI = 100


def _save(fig: Figure, path: str) -> str:
    FigureCanvasAgg(fig)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return path


def training_curves(scalars: Sequence[dict], out_dim: int, batch: int, path: str) -> str:
    """Loss; per-image and batch-mean teacher entropy (with log K); prototypes in use."""
    fig = Figure(figsize=(13, 3.8))
    ax_loss, ax_h, ax_used = fig.subplots(1, 3)
    for ax, keys, ylabel in ((ax_loss, ('loss', ), 'DINO loss'),
                             (ax_h, ('teacher_entropy', 'teacher_batch_entropy'),
                              'teacher entropy (nats)'),
                             (ax_used, ('prototypes_used', ), 'prototypes in use')):
        for key in keys:
            pts = series(scalars, key)
            if pts:
                ax.plot(*zip(*pts), label={'teacher_entropy': 'per image',
                                           'teacher_batch_entropy': 'batch mean'}.get(key, key))
        ax.set(xlabel='iteration', ylabel=ylabel)
    ax_h.axhline(np.log(out_dim), color='k', ls='--', lw=0.8, label=f'log K (K={out_dim})')
    ax_h.legend(fontsize=8)
    ax_used.axhline(min(out_dim, batch), color='k', ls='--', lw=0.8,
                    label=f'max possible ({min(out_dim, batch)})')
    ax_used.legend(fontsize=8)
    fig.suptitle('DINO pretraining: loss and collapse signals (logged iterations)')
    return _save(fig, path)


def auc_during_training_figure(curve: Dict[int, Dict[int, float]],
                               random_mean: Optional[Dict[int, float]], path: str) -> str:
    """Teacher Binary-AUC of every layer against the iteration (random init dashed)."""
    fig = Figure(figsize=(9, 4.2))
    ax = fig.subplots()
    steps = sorted(curve)
    layers = sorted({layer for v in curve.values() for layer in v})
    for layer in layers:
        line, = ax.plot(steps, [curve[s].get(layer, np.nan) for s in steps], marker='o',
                        label=f'layer {layer}')
        if random_mean and layer in random_mean:
            ax.axhline(random_mean[layer], color=line.get_color(), ls=':', lw=1)
    ax.axhline(50, color='k', ls='--', lw=0.8, label='chance (50)')
    ax.set(xlabel='iteration', ylabel='teacher Binary-AUC (raw, %)',
           title='Binary-AUC of the teacher during pretraining (dotted: random init, seed mean)')
    ax.legend(fontsize=8, ncol=2)
    return _save(fig, path)


def auc_per_layer_figure(results: Dict[str, Sequence[dict]], path: str) -> str:
    """Per-layer AUC of each model: a line for one result, mean with a min-max band for several
    (random-init seeds)."""
    fig = Figure(figsize=(9, 4.2))
    ax = fig.subplots()
    for name, runs in results.items():
        per = [auc_by_layer(r['binary_auc']) for r in runs if r.get('binary_auc')]
        if not per:
            continue
        layers = sorted(per[0])
        vals = np.array([[p[layer] for layer in layers] for p in per])
        line, = ax.plot(layers, vals.mean(0), marker='o',
                        label=name + (f' (mean of {len(per)})' if len(per) > 1 else ''))
        if len(per) > 1:
            ax.fill_between(layers, vals.min(0), vals.max(0), color=line.get_color(), alpha=0.2)
    ax.axhline(50, color='k', ls='--', lw=0.8, label='chance (50)')
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel='layer', ylabel='Binary-AUC (raw, %)',
           title='Binary-AUC per layer (band: min-max over random-init seeds)')
    ax.legend(fontsize=8)
    return _save(fig, path)


def _outline(mask: np.ndarray) -> np.ndarray:
    """Boundary pixels of a boolean mask."""
    m = mask.astype(bool)
    inner = m.copy()
    inner[1:] &= m[:-1]
    inner[:-1] &= m[1:]
    inner[:, 1:] &= m[:, :-1]
    inner[:, :-1] &= m[:, 1:]
    return m & ~inner


#: the heat maps' colour map and its fixed range: every map is min-max normalized to [0, 1]
#: (what Binary-AUC ranks), so one scale serves every model
CMAP, VMIN, VMAX = 'inferno', 0., 1.


def _heat(ax, fmap, shape, mask=None):
    """A [0, 1] map stretched over an image of ``shape`` (nearest), mask outline in cyan."""
    h, w = shape[:2]
    im = ax.imshow(np.asarray(fmap, np.float32), cmap=CMAP, vmin=VMIN, vmax=VMAX,
                   interpolation='nearest', extent=(-0.5, w - 0.5, h - 0.5, -0.5))
    if mask is not None:
        ax.contour(mask.astype(float), levels=[0.5], colors='cyan', linewidths=1.2)
    return im


def _image(ax, img, mask=None, title='image, mask outline'):
    ax.imshow(img)
    if mask is not None:
        ax.contour(mask.astype(float), levels=[0.5], colors='cyan', linewidths=1.2)
    ax.set_title(title, fontsize=9)


def _no_ticks(axes):
    for ax in np.asarray(axes).flat:
        ax.set_xticks([])
        ax.set_yticks([])


def _save_with_colorbar(fig, im, path: str) -> str:
    """Lay ``fig`` out with the one colour bar of its heat maps (``im``) on the right, save it."""
    FigureCanvasAgg(fig)
    fig.tight_layout(rect=(0, 0, 0.93, 1))
    cax = fig.add_axes((0.945, 0.1, 0.015, 0.8))
    fig.colorbar(im, cax=cax, label='map value (min-max normalized per map)')
    fig.savefig(path, dpi=DPI)
    return path


def maps_figure(examples: Dict[str, Sequence[tuple]], preprocessor, path: str,
                masks: Optional[Sequence[np.ndarray]] = None) -> str:
    """Rows: images; columns: the image with its mask outline, then the CLS map of the last
    layer of every model (mean over heads) as a heat map beside it, with the mask outline, its
    AUC and one colour bar (the same scale for every model).

    Args:
        examples (dict): model name -> ``(image, maps, auc, featmaps)`` tuples of
            :func:`~mmdinomamba.analysis.evaluate_binary_auc` (same images in every model).
        preprocessor: the data preprocessor (to undo the normalization).
        masks (Sequence[np.ndarray], optional): full-resolution masks for the outlines.
    """
    names = list(examples)
    n = min(len(v) for v in examples.values())
    fig = Figure(figsize=(2.9 * (1 + len(names)) + 1.2, 2.9 * n + 0.6))
    axes = fig.subplots(n, 1 + len(names), squeeze=False)
    im = None
    for i in range(n):
        img = plots.preprocessor_image(examples[names[0]][i][0], preprocessor)
        mask = masks[i] if masks is not None and i < len(masks) else None
        _image(axes[i, 0], img, mask)
        for j, name in enumerate(names, 1):
            _, maps, auc, fm = examples[name][i]
            im = _heat(axes[i, j], maps[-1].mean(dim=(0, 1)), img.shape, mask)
            a = np.asarray(auc)[-1].mean() * 100
            axes[i, j].set_title(f'{name}\nlayer {fm.layers[-1]}, AUC {a:.1f}', fontsize=9)
    _no_ticks(axes)
    fig.suptitle('CLS-to-patch maps of the last layer (CLS row of the token-mixing matrix, '
                 'mean over heads); cyan: object mask')
    return _save_with_colorbar(fig, im, path)


def heads_figure(examples: Dict[str, Sequence[tuple]], preprocessor, path: str,
                 masks: Optional[Sequence[np.ndarray]] = None, num_images: int = 2) -> str:
    """The "stethoscope" (paper Figure 4(b)): every head's CLS map of the last layer, per model,
    for the first ``num_images`` images, each with its AUC; one colour scale."""
    names = list(examples)
    n = min(num_images, *(len(v) for v in examples.values()))
    heads = examples[names[0]][0][1].shape[1]
    rows = n * len(names)
    fig = Figure(figsize=(max(9., 2.4 * (1 + heads) + 1.2), 2.4 * rows + 0.8))
    axes = fig.subplots(rows, 1 + heads, squeeze=False)
    im = None
    for i in range(n):
        img = plots.preprocessor_image(examples[names[0]][i][0], preprocessor)
        mask = masks[i] if masks is not None and i < len(masks) else None
        for j, name in enumerate(names):
            r = i * len(names) + j
            _, maps, auc, fm = examples[name][i]
            head_auc = np.asarray(auc)[-1].reshape(heads, -1).mean(1) * 100
            _image(axes[r, 0], img, mask, f'image {i + 1}: {name}')
            for h in range(heads):
                im = _heat(axes[r, h + 1], maps[-1, h].mean(dim=0), img.shape, mask)
                axes[r, h + 1].set_title(f'layer {fm.layers[-1]} head {h}: AUC {head_auc[h]:.1f}',
                                         fontsize=8)
    _no_ticks(axes)
    fig.suptitle('Per-head CLS-to-patch maps of the last layer\n(the paper\'s stethoscope, '
                 'Figure 4(b)); cyan: object mask')
    return _save_with_colorbar(fig, im, path)


def pca_figure(images: Sequence[np.ndarray], rgbs: Dict[str, Sequence[np.ndarray]],
               path: str) -> str:
    """The first three principal components of the patch features as RGB, per model."""
    names = list(rgbs)
    n = len(images)
    fig = Figure(figsize=(max(9., 3. * (1 + len(names))), 3. * n))
    axes = fig.subplots(n, 1 + len(names), squeeze=False)
    for i in range(n):
        axes[i, 0].imshow(images[i])
        axes[i, 0].set_title('image', fontsize=9)
        for j, name in enumerate(names, 1):
            axes[i, j].imshow(np.asarray(rgbs[name][i]), interpolation='nearest')
            axes[i, j].set_title(f'{name}: PCA of patch features', fontsize=9)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    return _save(fig, path)


def mixers_figure(summaries: Dict[str, dict], path: str) -> str:
    """Figure 4 in miniature: k-NN, linear probe and Binary-AUC of each mixer's teacher next to
    its random init (mean over seeds, error bar min-max)."""
    metrics = [('knn_top1', 'k-NN top-1 (%)'), ('linear_top1', 'linear top-1 (%)'),
               ('binary_auc_mean', 'Binary-AUC mean (raw, %)')]
    metrics = [m for m in metrics if all(m[0] in s for s in summaries.values())]
    fig = Figure(figsize=(4.2 * len(metrics), 4))
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    names = list(summaries)
    x = np.arange(len(names))
    for ax, (key, label) in zip(axes, metrics):
        teacher = [summaries[n][key]['teacher'] for n in names]
        rand = [summaries[n][key]['random'] for n in names]
        mean = [statistics.fmean(r) for r in rand]
        err = np.array([[m - min(r) for m, r in zip(mean, rand)],
                        [max(r) - m for m, r in zip(mean, rand)]])
        ax.bar(x - 0.2, teacher, 0.4, label='DINO teacher')
        ax.bar(x + 0.2, mean, 0.4, yerr=err, capsize=3, label='random init')
        ax.set_xticks(x, names)
        ax.set(ylabel=label)
    axes[0].legend(fontsize=8)
    fig.suptitle('Same DINO recipe and budget for every token mixer')
    return _save(fig, path)


def exists(path: str) -> bool:
    return osp.isfile(path)
