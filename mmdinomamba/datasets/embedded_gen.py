"""Deterministic "shapes on clutter" images: the project's embedded default data.

Every image is drawn from its own ``numpy`` generator seeded by ``(seed, split, index)``, so the
data set is identical on every machine and any image can be re-drawn alone. An image holds one
main object (its class label) and, with probability 0.5, a smaller non-overlapping distractor of
another class, on a textured background with clutter strokes. Objects vary in shape (the class),
colour, texture, scale, rotation and position.

Only numpy and Pillow are used; the layout on disk is written by :mod:`.embedded`.
"""
from dataclasses import dataclass, field
from typing import List, Tuple

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ('circle', 'square', 'triangle', 'star', 'cross', 'diamond')


@dataclass
class ShapeInstance:
    """One drawn object: its class index, polygon (x, y pairs) and bounding box (x, y, w, h)."""
    label: int
    polygon: List[float]
    bbox: Tuple[float, float, float, float]
    mask: np.ndarray = field(repr=False)


@dataclass
class ShapeSample:
    """One generated image with its annotations (all arrays are ``img_size x img_size``)."""
    image: np.ndarray  # (H, W, 3) uint8
    label: int  # class of the main (largest) object
    fg_mask: np.ndarray  # (H, W) bool, union of all objects
    semantic: np.ndarray  # (H, W) uint8, 0 background, k + 1 for class k
    instances: List[ShapeInstance]


def _unit_polygon(label: int, num_points: int = 32) -> np.ndarray:
    """Vertices of class ``label`` inside the unit disc, shape (P, 2)."""
    name = CLASSES[label]
    if name == 'circle':
        t = np.linspace(0, 2 * np.pi, num_points, endpoint=False)
        return np.stack([np.cos(t), np.sin(t)], 1)
    if name == 'square':
        return np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]]) * 0.75
    if name == 'triangle':
        t = np.pi / 2 + np.arange(3) * 2 * np.pi / 3
        return np.stack([np.cos(t), -np.sin(t)], 1)
    if name == 'star':
        t = np.pi / 2 + np.arange(10) * np.pi / 5
        r = np.where(np.arange(10) % 2 == 0, 1.0, 0.42)
        return np.stack([r * np.cos(t), -r * np.sin(t)], 1)
    if name == 'cross':
        a, b = 0.3, 0.95
        return np.array([[-a, -b], [a, -b], [a, -a], [b, -a], [b, a], [a, a], [a, b], [-a, b],
                         [-a, a], [-b, a], [-b, -a], [-a, -a]])
    if name == 'diamond':
        return np.array([[0, -1], [0.6, 0], [0, 1], [-0.6, 0]])
    raise KeyError(f'unknown shape class {label}')


def _texture(rng: np.random.Generator, size: int, c1: np.ndarray, c2: np.ndarray) -> np.ndarray:
    """A (size, size, 3) float texture: solid, stripes, checker or speckle in two colours."""
    kind = rng.integers(4)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    if kind == 0:
        w = np.zeros((size, size), np.float32)
    elif kind == 1:
        theta = rng.uniform(0, np.pi)
        period = rng.uniform(3, 8)
        w = (np.sin((xx * np.cos(theta) + yy * np.sin(theta)) * 2 * np.pi / period) > 0)
    elif kind == 2:
        cell = int(rng.integers(3, 8))
        w = ((xx // cell + yy // cell) % 2).astype(bool)
    else:
        w = rng.random((size, size)) < 0.3
    w = w.astype(np.float32)[..., None]
    return c1 * (1 - w) + c2 * w


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """Smooth two-colour noise plus thin clutter strokes, (size, size, 3) float in [0, 255]."""
    grid = rng.random((4, 4)).astype(np.float32)
    low = np.asarray(Image.fromarray((grid * 255).astype(np.uint8)).resize((size, size),
                                                                          Image.BICUBIC))
    low = (low.astype(np.float32) / 255.0)[..., None]
    c1, c2 = rng.uniform(40, 215, 3), rng.uniform(40, 215, 3)
    bg = c1 * (1 - low) + c2 * low + rng.normal(0, 6, (size, size, 3))
    canvas = Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(canvas)
    for _ in range(int(rng.integers(3, 9))):
        pts = [tuple(p) for p in rng.uniform(0, size, (2, 2))]
        color = tuple(int(c) for c in rng.uniform(0, 255, 3))
        draw.line(pts, fill=color, width=int(rng.integers(1, 3)))
    return np.asarray(canvas).astype(np.float32)


def _place(rng, size, radius, taken, tries=50):
    """A centre for a disc of ``radius`` fully inside the image, away from ``taken`` discs."""
    for _ in range(tries):
        cx, cy = rng.uniform(radius + 1, size - radius - 1, 2)
        if all(np.hypot(cx - x, cy - y) > radius + r + 1 for x, y, r in taken):
            return float(cx), float(cy)
    return None


def _draw_object(rng, size, label, cx, cy, radius) -> ShapeInstance:
    angle = rng.uniform(0, 2 * np.pi) if CLASSES[label] != 'circle' else 0.0
    rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    poly = _unit_polygon(label) @ rot.T * radius + np.array([cx, cy])
    canvas = Image.new('L', (size, size), 0)
    ImageDraw.Draw(canvas).polygon([tuple(p) for p in poly], fill=1)
    mask = np.asarray(canvas).astype(bool)
    x0, y0 = poly.min(0).clip(0, size)
    x1, y1 = poly.max(0).clip(0, size)
    return ShapeInstance(label, poly.reshape(-1).round(2).tolist(),
                         (float(x0), float(y0), float(x1 - x0), float(y1 - y0)), mask)


def draw_sample(seed: int, split_id: int, index: int, img_size: int) -> ShapeSample:
    """Draw image ``index`` of split ``split_id`` (0 train, 1 val); pure function of its args."""
    rng = np.random.default_rng([seed, split_id, index])
    size = img_size
    image = _background(rng, size)
    main = int(rng.integers(len(CLASSES)))
    labels = [main]
    radii = [rng.uniform(0.22, 0.36) * size]
    if rng.random() < 0.5:
        labels.append(int((main + rng.integers(1, len(CLASSES))) % len(CLASSES)))
        radii.append(rng.uniform(0.1, 0.16) * size)
    taken, instances = [], []
    for label, radius in zip(labels, radii):
        centre = _place(rng, size, radius, taken)
        if centre is None:
            continue
        taken.append((*centre, radius))
        inst = _draw_object(rng, size, label, *centre, radius)
        c1, c2 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
        image[inst.mask] = _texture(rng, size, c1, c2)[inst.mask]
        instances.append(inst)
    semantic = np.zeros((size, size), np.uint8)
    for inst in instances:
        semantic[inst.mask] = inst.label + 1
    fg = semantic > 0
    return ShapeSample(np.clip(image, 0, 255).astype(np.uint8), main, fg, semantic, instances)
