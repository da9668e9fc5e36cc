"""A suite of small labelled data sets of different kinds, to check that the demo's DINO recipe
learns on data it was not tuned to.

Each set isolates one cue that tells its classes apart, at its own image size and class count:

=========  =========================================================  =======  =======
name       classes differ in                                          classes  size px
=========  =========================================================  =======  =======
strokes    the glyph (white pen strokes on a plain black background,  10       32
           grayscale, like low-resolution scans)
shapes     the outline only (random fill, background and texture      6        64
           colours per image)
textures   the surface pattern only (one blob shape, random colours)  5        80
colours    the hue only (the same shapes and noise for every class)   8        48
=========  =========================================================  =======  =======

:func:`write_suite_set` writes one set in the documented folder layout (``classes.txt``,
``meta/{train,val}.txt``, ``train/``, ``val/``, ``masks/{train,val}/``; see
:mod:`mmdinomamba.datasets.folder`), PNG images and masks. Every image is drawn from its own
seeded generator ``(seed, split, index)``: the same arguments give the same files.
"""
import colorsys
import os
import os.path as osp
import shutil
from typing import Callable, Dict, Tuple

import numpy as np
from PIL import Image, ImageDraw

from mmdinomamba.utils.files import scratch_path

__all__ = ['SUITE', 'write_suite_set', 'draw_example']

GLYPHS = {  # polylines in the unit square (x right, y down), one per class
    'bar': [[(0.5, 0.1), (0.5, 0.9)]],
    'dash': [[(0.1, 0.5), (0.9, 0.5)]],
    'vee': [[(0.15, 0.15), (0.5, 0.85), (0.85, 0.15)]],
    'zigzag': [[(0.1, 0.2), (0.9, 0.2), (0.1, 0.8), (0.9, 0.8)]],
    'box': [[(0.2, 0.2), (0.8, 0.2), (0.8, 0.8), (0.2, 0.8), (0.2, 0.2)]],
    'plus': [[(0.5, 0.1), (0.5, 0.9)], [(0.1, 0.5), (0.9, 0.5)]],
    'ex': [[(0.15, 0.15), (0.85, 0.85)], [(0.85, 0.15), (0.15, 0.85)]],
    'tee': [[(0.1, 0.15), (0.9, 0.15)], [(0.5, 0.15), (0.5, 0.9)]],
    'ell': [[(0.25, 0.1), (0.25, 0.85), (0.85, 0.85)]],
    'arrow': [[(0.5, 0.9), (0.5, 0.1)], [(0.2, 0.4), (0.5, 0.1), (0.8, 0.4)]],
}
SHAPES = ('disc', 'square', 'triangle', 'star', 'cross', 'ring')
TEXTURES = ('hstripes', 'vstripes', 'checker', 'dots', 'diagonal')
HUES = tuple(i / 8 for i in range(8))


def _rand_colour(rng) -> Tuple[int, int, int]:
    return tuple(int(c) for c in rng.integers(0, 256, 3))


def _noise_bg(rng, size: int, base, amp: float = 25., gray: bool = False) -> np.ndarray:
    low = rng.normal(0, amp, (size // 8 + 1, size // 8 + 1, 1 if gray else 3))
    low = np.kron(low, np.ones((8, 8, 1)))[:size, :size]
    return np.clip(np.asarray(base, np.float32) + low + rng.normal(0, 6, (size, size, 3)),
                   0, 255)


def _shape_mask(kind: str, rng, size: int, scale=(0.35, 0.6)) -> np.ndarray:
    """A boolean mask of one shape at a random size, position and rotation."""
    r = size * rng.uniform(*scale) / 2
    cx, cy = (rng.uniform(r + 1, size - r - 1) for _ in range(2))
    ang = rng.uniform(0, 2 * np.pi)
    img = Image.new('L', (size, size), 0)
    d = ImageDraw.Draw(img)

    def poly(n, radii):
        return [(cx + radii[k % len(radii)] * np.cos(ang + 2 * np.pi * k / n),
                 cy + radii[k % len(radii)] * np.sin(ang + 2 * np.pi * k / n)) for k in range(n)]
    if kind == 'disc':
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=255)
    elif kind == 'ring':
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=255)
        d.ellipse([cx - r / 2, cy - r / 2, cx + r / 2, cy + r / 2], fill=0)
    elif kind == 'square':
        d.polygon(poly(4, [r]), fill=255)
    elif kind == 'triangle':
        d.polygon(poly(3, [r]), fill=255)
    elif kind == 'star':
        d.polygon(poly(10, [r, r * 0.45]), fill=255)
    elif kind == 'cross':
        d.polygon(poly(12, [r, r * 0.42, r * 0.42]), fill=255)
    elif kind == 'blob':
        d.polygon(poly(16, list(r * rng.uniform(0.75, 1.0, 16))), fill=255)
    return np.asarray(img) > 127


def _texture(kind: str, rng, size: int) -> np.ndarray:
    """A boolean pattern of the whole image (period and phase vary per image)."""
    yy, xx = np.mgrid[:size, :size].astype(np.float32)
    p = rng.uniform(5, 8) * size / 64
    ph = rng.uniform(0, p)
    if kind == 'hstripes':
        return ((yy + ph) % p) < p / 2
    if kind == 'vstripes':
        return ((xx + ph) % p) < p / 2
    if kind == 'diagonal':
        return ((xx + yy + ph) % (1.4 * p)) < 0.7 * p
    if kind == 'checker':
        return (((xx + ph) // p + (yy + ph) // p) % 2) == 0
    return (((xx + ph) % p - p / 2) ** 2 + ((yy + ph) % p - p / 2) ** 2) < (p / 3) ** 2


def _strokes(label: int, rng, size: int):
    s = 4  # drawn at 4x and downsampled: anti-aliased strokes, like a scan
    img = Image.new('L', (size * s, size * s), 0)
    d = ImageDraw.Draw(img)
    scale = rng.uniform(0.55, 0.85) * size * s
    off = rng.uniform(0.05 * size * s, size * s - scale - 0.05 * size * s, 2)
    shear = rng.uniform(-0.25, 0.25)
    width = int(rng.uniform(0.07, 0.12) * size * s)
    for line in list(GLYPHS.values())[label]:
        pts = [(off[0] + scale * (x + shear * (y - 0.5) + rng.normal(0, 0.03)),
                off[1] + scale * (y + rng.normal(0, 0.03))) for x, y in line]
        d.line(pts, fill=255, width=width, joint='curve')
    g = np.asarray(img.resize((size, size), Image.BILINEAR)).astype(np.float32)
    g = np.clip(g * rng.uniform(0.7, 1.0) + rng.normal(0, 4, g.shape), 0, 255)
    return np.repeat(g[..., None], 3, 2), g > 64


def _shapes(label: int, rng, size: int):
    mask = _shape_mask(SHAPES[label], rng, size)
    img = _noise_bg(rng, size, _rand_colour(rng))
    tex = _texture(TEXTURES[int(rng.integers(len(TEXTURES)))], rng, size)
    fill = np.where(tex[..., None], _rand_colour(rng), _rand_colour(rng))
    img[mask] = fill[mask]
    return img, mask


def _textures(label: int, rng, size: int):
    mask = _shape_mask('blob', rng, size, scale=(0.45, 0.75))
    img = _noise_bg(rng, size, _rand_colour(rng))
    tex = _texture(TEXTURES[label], rng, size)
    fill = np.where(tex[..., None], _rand_colour(rng), _rand_colour(rng))
    img[mask] = fill[mask]
    return img, mask


def _colours(label: int, rng, size: int):
    mask = _shape_mask(SHAPES[int(rng.integers(len(SHAPES)))], rng, size)
    img = _noise_bg(rng, size, [rng.uniform(60, 190)] * 3, gray=True)
    h = (HUES[label] + rng.normal(0, 0.012)) % 1
    rgb = np.array(colorsys.hsv_to_rgb(h, rng.uniform(0.6, 1), rng.uniform(0.6, 1))) * 255
    shade = rng.uniform(0.85, 1.15, (size, size, 1))
    img[mask] = np.clip(rgb * shade, 0, 255)[mask]
    return img, mask


#: name -> (class names, drawing function, image size, train images, val images)
SUITE: Dict[str, tuple] = {
    'strokes': (list(GLYPHS), _strokes, 32, 1400, 400),
    'shapes': (list(SHAPES), _shapes, 64, 1800, 360),
    'textures': (list(TEXTURES), _textures, 80, 1500, 350),
    'colours': ([f'hue{int(h * 360):03d}' for h in HUES], _colours, 48, 1600, 400),
}


def draw_example(name: str, seed: int, split_id: int, index: int):
    """One image ``(H, W, 3) uint8``, its label and its boolean foreground mask."""
    classes, draw, size, _, _ = SUITE[name]
    rng = np.random.default_rng([seed, split_id, index])
    label = int(rng.integers(len(classes)))
    img, mask = draw(label, rng, size)
    return np.clip(img, 0, 255).astype(np.uint8), label, mask


def write_suite_set(name: str, root: str, seed: int = 0, num_train: int = None,
                    num_val: int = None, log: Callable[[str], None] = print) -> str:
    """Write the suite set ``name`` into the new folder ``root`` (an existing one is refused:
    nothing is overwritten). Written under a scratch name and renamed when complete."""
    if name not in SUITE:
        raise KeyError(f'unknown suite set {name!r}; choose from {sorted(SUITE)}')
    if osp.exists(root):
        raise FileExistsError(f'{root} exists; choose a new folder (nothing is overwritten)')
    classes, _, size, n_train, n_val = SUITE[name]
    counts = (num_train or n_train, num_val or n_val)
    os.makedirs(osp.dirname(osp.abspath(root)), exist_ok=True)
    tmp = scratch_path(root)
    os.makedirs(osp.join(tmp, 'meta'))
    try:
        with open(osp.join(tmp, 'classes.txt'), 'w') as f:
            f.write('\n'.join(classes) + '\n')
        for split_id, (split, n) in enumerate(zip(('train', 'val'), counts)):
            lines = []
            for i in range(n):
                img, label, mask = draw_example(name, seed, split_id, i)
                rel = f'{classes[label]}/{split}_{i:05d}.png'
                for sub, arr in ((split, img), (f'masks/{split}', mask.astype(np.uint8) * 255)):
                    path = osp.join(tmp, sub, rel)
                    os.makedirs(osp.dirname(path), exist_ok=True)
                    Image.fromarray(arr).save(path)
                lines.append(f'{rel} {label}')
            with open(osp.join(tmp, 'meta', f'{split}.txt'), 'w') as f:
                f.write('\n'.join(lines) + '\n')
        os.rename(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f'{root}: {name}, {counts[0]} train + {counts[1]} val images of {size} px, '
        f'{len(classes)} classes, with masks')
    return root
