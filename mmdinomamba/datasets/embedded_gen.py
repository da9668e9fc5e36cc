"""Deterministic "objects on dead leaves" images: the project's embedded default data.

Every image is drawn from its own ``numpy`` generator seeded by ``(seed, split, index)``, so the
data set is identical on every machine and any image can be re-drawn alone.

Each class is one kind of object with its own look, as real categories have: a shape, a surface
pattern and a pair of colours (:data:`APPEARANCE`; colours jittered per image). An image holds one
main object (its class label) placed at a random position, size and rotation on a "dead
leaves" background (overlapping discs and squares of random colours covering the image), and
with probability :data:`DISTRACTOR_PROB` a smaller object of another class. Why this design:
self-supervised learning (DINO) learns what stays the same between two crops of an image and
differs between images. On a dead-leaves background two crops share little background but the
same object, so the object is what DINO can learn (and what its CLS-to-patch maps should single
out); the many random colours also keep a randomly initialized network from reading the class
off the mean colour of the image. docs/dino_small_scale.md has the measurements behind it.

Only numpy and Pillow are used; the layout on disk is written by :mod:`.embedded`.
"""
from dataclasses import dataclass, field
from typing import List, Tuple

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ('circle', 'square', 'triangle', 'star', 'cross', 'diamond')
#: per class: surface pattern and its two colours (RGB), in the order of :data:`CLASSES`
APPEARANCE = (
    ('solid', (220, 40, 40), (250, 220, 60)),  # red
    ('hstripes', (40, 90, 220), (240, 240, 240)),  # blue / white
    ('vstripes', (30, 160, 60), (20, 20, 20)),  # green / black
    ('checker', (240, 130, 20), (90, 40, 140)),  # orange / purple
    ('speckle', (250, 120, 200), (40, 190, 200)),  # pink / cyan
    ('dots', (130, 80, 40), (200, 200, 120)),  # brown / khaki
)
COLOR_JITTER = 20.  # std of the per-image change of each colour channel
MAIN_COUNT = (1, 1)  # objects of the image's class: uniform in this range (inclusive)
MAIN_RADIUS = (0.25, 0.4)  # radius of the main object, as a fraction of the image side
DISTRACTOR_PROB = 0.
DISTRACTOR_RADIUS = (0.1, 0.15)


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


def _pattern(rng: np.random.Generator, size: int, kind: str, c1: np.ndarray,
             c2: np.ndarray) -> np.ndarray:
    """A (size, size, 3) float surface of ``kind`` in colours ``c1`` / ``c2`` (random phase)."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    phase = rng.uniform(0, 10)
    if kind == 'solid':
        w = np.zeros((size, size), bool)
    elif kind == 'hstripes':
        w = np.sin((yy + phase) * 2 * np.pi / rng.uniform(5, 7)) > 0
    elif kind == 'vstripes':
        w = np.sin((xx + phase) * 2 * np.pi / rng.uniform(5, 7)) > 0
    elif kind == 'checker':
        cell = rng.uniform(3, 4.5)
        w = (np.floor((xx + phase) / cell) + np.floor((yy + phase) / cell)) % 2 > 0
    elif kind == 'speckle':
        w = rng.random((size, size)) < 0.4
    elif kind == 'dots':
        per = rng.uniform(6, 8)
        w = np.hypot((xx + phase) % per - per / 2, (yy + phase) % per - per / 2) < per * 0.25
    else:
        raise KeyError(f'unknown pattern {kind!r}')
    w = w.astype(np.float32)[..., None]
    return c1 * (1 - w) + c2 * w


def _background(rng: np.random.Generator, size: int, num=(40, 70), radius=(0.04, 0.2)
                ) -> np.ndarray:
    """A dead-leaves background: overlapping discs and squares of random colours covering
    the image, (size, size, 3) float in [0, 255]."""
    canvas = Image.fromarray(rng.integers(0, 256, (1, 1, 3), dtype=np.uint8).repeat(
        size, 0).repeat(size, 1))
    draw = ImageDraw.Draw(canvas)
    for _ in range(int(rng.integers(*num))):
        cx, cy = rng.uniform(0, size, 2)
        r = rng.uniform(*radius) * size
        color = tuple(int(c) for c in rng.uniform(0, 255, 3))
        shape = draw.rectangle if rng.random() < 0.5 else draw.ellipse
        shape([cx - r, cy - r, cx + r, cy + r], fill=color)
    return np.asarray(canvas).astype(np.float32) + rng.normal(0, 6, (size, size, 3))


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


def _surface(rng, size, label) -> np.ndarray:
    """The class's pattern in its colours, each colour jittered for this image."""
    kind, c1, c2 = APPEARANCE[label]
    c1, c2 = (np.clip(np.asarray(c, np.float32) + rng.normal(0, COLOR_JITTER, 3), 0, 255)
              for c in (c1, c2))
    return _pattern(rng, size, kind, c1, c2)


def draw_sample(seed: int, split_id: int, index: int, img_size: int) -> ShapeSample:
    """Draw image ``index`` of split ``split_id`` (0 train, 1 val); pure function of its args."""
    rng = np.random.default_rng([seed, split_id, index])
    size = img_size
    image = _background(rng, size)
    main = int(rng.integers(len(CLASSES)))
    count = int(rng.integers(MAIN_COUNT[0], MAIN_COUNT[1] + 1))
    labels = [main] * count
    radii = sorted((rng.uniform(*MAIN_RADIUS) * size for _ in range(count)), reverse=True)
    if rng.random() < DISTRACTOR_PROB:
        labels.append(int((main + rng.integers(1, len(CLASSES))) % len(CLASSES)))
        radii.append(rng.uniform(*DISTRACTOR_RADIUS) * size)
    taken, instances = [], []
    for label, radius in zip(labels, radii):
        centre = _place(rng, size, radius, taken)
        if centre is None:
            continue
        taken.append((*centre, radius))
        inst = _draw_object(rng, size, label, *centre, radius)
        image[inst.mask] = _surface(rng, size, label)[inst.mask]
        instances.append(inst)
    semantic = np.zeros((size, size), np.uint8)
    for inst in instances:
        semantic[inst.mask] = inst.label + 1
    fg = semantic > 0
    return ShapeSample(np.clip(image, 0, 255).astype(np.uint8), main, fg, semantic, instances)
