"""Figures for feature maps, ROC curves, PCA and per-layer AUC (paper Figures 3-12).

Uses matplotlib's object API with the Agg canvas (no pyplot, no global backend switch), so it
works headless and inside training. Every ``plot_*`` returns the figure as an RGB ``uint8``
array ``(H, W, 3)`` (for ``visualizer.add_image``) and writes a PNG when ``out_file`` is given.
"""
import os
import os.path as osp
import textwrap
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from mmdinomamba.datasets.normalization import IMAGENET_MEAN, IMAGENET_STD


def to_image(inputs: torch.Tensor, mean: Sequence[float] = IMAGENET_MEAN,
             std: Sequence[float] = IMAGENET_STD, bgr: bool = False) -> np.ndarray:
    """Undo the data preprocessor's normalization.

    Args:
        inputs (Tensor): (3, H, W) normalized image.
        mean, std (Sequence[float]): per-channel values in 0-255. Defaults to ImageNet's.
        bgr (bool): the channels are BGR (a preprocessor without ``to_rgb``). Defaults to False.

    Returns:
        np.ndarray: (H, W, 3) uint8 RGB.
    """
    x = inputs.detach().float().cpu()
    x = x * torch.tensor(std).view(3, 1, 1) + torch.tensor(mean).view(3, 1, 1)
    x = x.flip(0) if bgr else x
    return x.clamp(0, 255).round().byte().permute(1, 2, 0).numpy()


def preprocessor_image(inputs: torch.Tensor, preprocessor) -> np.ndarray:
    """:func:`to_image` with the mean, std and channel order of a ``ClsDataPreprocessor``."""
    mean = getattr(preprocessor, 'mean', None)
    std = getattr(preprocessor, 'std', None)
    return to_image(inputs, IMAGENET_MEAN if mean is None else mean.flatten().tolist(),
                    IMAGENET_STD if std is None else std.flatten().tolist(),
                    bgr=not getattr(preprocessor, '_channel_conversion', True))


def overlay(img: np.ndarray, fmap, alpha: float = 0.5, cmap: str = 'jet') -> np.ndarray:
    """Blend a [0, 1] map, nearest-upsampled to the image size, over an RGB image.

    Args:
        img (np.ndarray): (H, W, 3) uint8.
        fmap (Tensor | np.ndarray): (h, w) values in [0, 1].
        alpha (float): weight of the heat map. Defaults to 0.5.
        cmap (str): matplotlib colormap. Defaults to 'jet'.

    Returns:
        np.ndarray: (H, W, 3) float in [0, 1].
    """
    m = torch.as_tensor(np.asarray(fmap), dtype=torch.float32)[None, None]
    m = F.interpolate(m, size=img.shape[:2], mode='nearest')[0, 0].clamp(0, 1).numpy()
    heat = colormaps[cmap](m)[..., :3]
    return (1 - alpha) * img.astype(np.float64) / 255 + alpha * heat


def _finish(fig: Figure, out_file: Optional[str]) -> np.ndarray:
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    arr = np.asarray(canvas.buffer_rgba())[..., :3].copy()
    if out_file:
        os.makedirs(osp.dirname(osp.abspath(out_file)), exist_ok=True)
        fig.savefig(out_file)
    return arr


def _panels(nl: int, nh: int, nr: int):
    """Grid layout: rows = layers (x heads when there are several query tokens)."""
    if nr > 1:
        return [[(i, h, r) for r in range(nr)] for i in range(nl) for h in range(nh)]
    return [[(i, h, 0) for h in range(nh)] for i in range(nl)]


def plot_featmap_grid(img: np.ndarray, maps, layers: Sequence[int], query_index=None,
                      out_file: Optional[str] = None, title: str = '',
                      aucs=None) -> np.ndarray:
    """Image plus map overlays (Figures 5, 7-11).

    One row per layer and one column per head; with several query tokens (registers,
    Figure 7) one row per (layer, head) and one column per query token.

    Args:
        img (np.ndarray): (H, W, 3) uint8.
        maps (Tensor): (num_layers, heads, R, h, w) maps in [0, 1].
        layers (Sequence[int]): layer index of each entry of dim 0.
        query_index (Sequence[int], optional): token positions of the R queries (labels).
        out_file (str, optional): PNG path. Defaults to None.
        title (str): figure title. Defaults to ''.
        aucs (Tensor, optional): (num_layers, heads, R) AUCs printed above each panel.

    Returns:
        np.ndarray: (H', W', 3) uint8 rendering.
    """
    nl, nh, nr = maps.shape[:3]
    rows = _panels(nl, nh, nr)
    ncol = len(rows[0])
    width = 1.6 * (ncol + 1)
    fig = Figure(figsize=(width, 1.8 * len(rows) + 0.5), dpi=80)
    axes = fig.subplots(len(rows), ncol + 1, squeeze=False)
    for row, panels in zip(axes, rows):
        i, h, _ = panels[0]
        row[0].imshow(img)
        row[0].set_ylabel(f'layer {layers[i]}' + (f' h{h}' if nr > 1 and nh > 1 else ''),
                          fontsize=8)
        for ax, (i, h, r) in zip(row[1:], panels):
            ax.imshow(overlay(img, maps[i, h, r]))
            label = f'tok {query_index[r]}' if nr > 1 and query_index is not None else (
                f'h{h}' if nh > 1 else '')
            if aucs is not None:
                label += f'\nAUC {100 * float(aucs[i, h, r]):.1f}'
            ax.set_title(label.strip(), fontsize=7)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    # ~13 characters of a 9 pt title fit one inch: wrap instead of clipping at the figure edge.
    fig.suptitle(textwrap.fill(title, max(16, int(13 * width))), fontsize=9)
    fig.tight_layout()
    return _finish(fig, out_file)


def plot_roc(curves: Sequence[Tuple[str, np.ndarray, np.ndarray, float]],
             out_file: Optional[str] = None, title: str = 'ROC') -> np.ndarray:
    """ROC curves with their AUC in the legend (paper Figures 8, 9, 11 bottom).

    Args:
        curves: (label, fpr, tpr, auc) per curve.
        out_file (str, optional): PNG path. Defaults to None.
        title (str): title. Defaults to 'ROC'.

    Returns:
        np.ndarray: RGB uint8 rendering.
    """
    fig = Figure(figsize=(4, 4), dpi=80)
    ax = fig.subplots()
    for label, fpr, tpr, auc in curves:
        ax.plot(np.asarray(fpr), np.asarray(tpr), label=f'{label} (AUC {100 * auc:.1f})')
    ax.plot([0, 1], [0, 1], 'k--', lw=0.8)
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel='FPR', ylabel='TPR', title=title)
    ax.legend(fontsize=7, loc='lower right')
    fig.tight_layout()
    return _finish(fig, out_file)


def plot_pca(img: np.ndarray, rgb, out_file: Optional[str] = None,
             title: str = 'PCA') -> np.ndarray:
    """Image next to the PCA-RGB rendering of its patch features (Figures 6, 12).

    Args:
        img (np.ndarray): (H, W, 3) uint8.
        rgb (Tensor | np.ndarray): (h, w, 3) in [0, 1].
        out_file (str, optional): PNG path. Defaults to None.
        title (str): title. Defaults to 'PCA'.

    Returns:
        np.ndarray: RGB uint8 rendering.
    """
    fig = Figure(figsize=(5, 2.6), dpi=80)
    axes = fig.subplots(1, 2)
    axes[0].imshow(img)
    axes[1].imshow(np.asarray(rgb), interpolation='nearest')
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return _finish(fig, out_file)


def plot_auc_per_layer(series: Dict[str, Dict[int, float]], out_file: Optional[str] = None,
                       ylabel: str = 'Binary-AUC (%)') -> np.ndarray:
    """AUC against layer index, one line per model (Figure 4e style).

    Args:
        series (dict): model name -> {layer index: AUC in %}.
        out_file (str, optional): PNG path. Defaults to None.
        ylabel (str): y label. Defaults to 'Binary-AUC (%)'.

    Returns:
        np.ndarray: RGB uint8 rendering.
    """
    fig = Figure(figsize=(5, 3.2), dpi=80)
    ax = fig.subplots()
    for name, values in series.items():
        xs = sorted(values)
        ax.plot(xs, [values[x] for x in xs], marker='o', label=name)
    ax.axhline(50, color='k', ls='--', lw=0.8)
    ax.set(xlabel='layer', ylabel=ylabel)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _finish(fig, out_file)
