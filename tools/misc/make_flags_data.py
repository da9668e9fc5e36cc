"""Make a second small data set, built differently from the embedded one, to check that the demo's
DINO recipe is not tuned to the embedded data alone.

"Flags on photos": 10 classes, each a flag design (stripes, crosses, a disc, a diagonal, in fixed
colours), drawn at a random size, position, aspect and small rotation onto a random crop of the
two photographs that ship with scikit-learn (``sklearn.datasets.load_sample_images``: a temple
and a flower; nothing is downloaded), with per-image colour and brightness changes. The layout is
the one ``tools/demo.py --data-root`` reads: ``classes.txt``, ``meta/{train,val}.txt``,
``train/``, ``val/``, ``masks/{train,val}/`` (JPEG images, PNG masks).

    python tools/misc/make_flags_data.py --root data/flags [--num-train 2000 --num-val 500 \\
        --img-size 64 --seed 0]
    python tools/demo.py --data-root data/flags --work-dir work_dirs/demo_flags

The output folder must not exist yet (nothing is ever overwritten).
"""
import argparse
import os
import os.path as osp
import shutil
import sys

import numpy as np
from PIL import Image, ImageDraw

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

from mmdinomamba.utils.files import scratch_path  # noqa: E402

#: name -> (kind, colours): the flag designs
FLAGS = {
    'tricolour_v': ('vbands', [(0, 85, 164), (255, 255, 255), (239, 65, 53)]),
    'tricolour_h': ('hbands', [(0, 0, 0), (221, 0, 0), (255, 206, 0)]),
    'bicolour_h': ('hbands', [(0, 87, 183), (255, 215, 0)]),
    'nordic_cross': ('cross_off', [(200, 16, 46), (255, 255, 255)]),
    'centre_cross': ('cross', [(255, 255, 255), (213, 43, 30)]),
    'disc': ('disc', [(255, 255, 255), (188, 0, 45)]),
    'diagonal': ('diagonal', [(0, 122, 61), (252, 209, 22)]),
    'stripes5': ('hbands', [(0, 56, 168), (255, 255, 255)] * 2 + [(0, 56, 168)]),
    'quarters': ('quarters', [(0, 0, 0), (255, 255, 255)]),
    'border': ('border', [(0, 100, 0), (255, 140, 0)]),
}


def _flag(kind, colors, w, h):
    """(h, w, 3) uint8 flag."""
    img = Image.new('RGB', (w, h), colors[0])
    d = ImageDraw.Draw(img)
    n = len(colors)
    if kind == 'vbands':
        for i, c in enumerate(colors):
            d.rectangle([i * w / n, 0, (i + 1) * w / n, h], fill=c)
    elif kind == 'hbands':
        for i, c in enumerate(colors):
            d.rectangle([0, i * h / n, w, (i + 1) * h / n], fill=c)
    elif kind in ('cross', 'cross_off'):
        cx = w * (0.35 if kind == 'cross_off' else 0.5)
        t = 0.1 * min(w, h)
        d.rectangle([cx - t, 0, cx + t, h], fill=colors[1])
        d.rectangle([0, h / 2 - t, w, h / 2 + t], fill=colors[1])
    elif kind == 'disc':
        r = 0.3 * min(w, h)
        d.ellipse([w / 2 - r, h / 2 - r, w / 2 + r, h / 2 + r], fill=colors[1])
    elif kind == 'diagonal':
        d.polygon([(0, h), (w, 0), (w, h)], fill=colors[1])
    elif kind == 'quarters':
        d.rectangle([0, 0, w / 2, h / 2], fill=colors[1])
        d.rectangle([w / 2, h / 2, w, h], fill=colors[1])
    elif kind == 'border':
        t = 0.18 * min(w, h)
        d.rectangle([t, t, w - t, h - t], fill=colors[1])
    return np.asarray(img)


def draw(photos, rng, size):
    """One image, its label and its foreground mask."""
    label = int(rng.integers(len(FLAGS)))
    kind, colors = list(FLAGS.values())[label]
    photo = photos[int(rng.integers(len(photos)))]
    side = int(rng.integers(size, min(photo.shape[:2])))
    y, x = rng.integers(0, photo.shape[0] - side), rng.integers(0, photo.shape[1] - side)
    bg = Image.fromarray(photo[y:y + side, x:x + side]).resize((size, size), Image.BILINEAR)
    w = int(size * rng.uniform(0.45, 0.8))
    h = int(w * rng.uniform(0.55, 0.8))
    jitter = rng.normal(0, 15, 3)
    flag = np.clip(_flag(kind, colors, w, h).astype(np.float32) + jitter, 0, 255)
    flag = Image.fromarray(flag.astype(np.uint8)).convert('RGBA')
    flag = flag.rotate(float(rng.uniform(-20, 20)), resample=Image.BILINEAR, expand=True)
    px = int(rng.integers(0, size - flag.width + 1)) if flag.width < size else 0
    py = int(rng.integers(0, size - flag.height + 1)) if flag.height < size else 0
    canvas = bg.convert('RGBA')
    canvas.alpha_composite(flag, (px, py))
    mask = Image.new('L', (size, size), 0)
    mask.paste(flag.getchannel('A'), (px, py))
    img = np.asarray(canvas.convert('RGB')).astype(np.float32) * rng.uniform(0.75, 1.25)
    return np.clip(img, 0, 255).astype(np.uint8), label, (np.asarray(mask) > 127)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--root', required=True, help='output folder (must not exist)')
    parser.add_argument('--num-train', type=int, default=2000)
    parser.add_argument('--num-val', type=int, default=500)
    parser.add_argument('--img-size', type=int, default=64)
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args(argv)
    if osp.exists(args.root):
        raise SystemExit(f'{args.root} exists; choose a new folder (nothing is overwritten)')
    from sklearn.datasets import load_sample_images
    photos = [np.asarray(p) for p in load_sample_images().images]
    os.makedirs(osp.dirname(osp.abspath(args.root)), exist_ok=True)
    tmp = scratch_path(args.root)  # the project's scratch name: a killed run's is recognized
    os.makedirs(tmp)
    try:
        names = list(FLAGS)
        with open(osp.join(tmp, 'classes.txt'), 'w') as f:
            f.write('\n'.join(names) + '\n')
        os.makedirs(osp.join(tmp, 'meta'))
        for split_id, (split, n) in enumerate((('train', args.num_train),
                                               ('val', args.num_val))):
            lines = []
            for i in range(n):
                rng = np.random.default_rng([args.seed, split_id, i])
                img, label, mask = draw(photos, rng, args.img_size)
                rel = f'{names[label]}/{split}_{i:05d}.jpg'
                for sub, arr, ext in ((split, img, '.jpg'), (f'masks/{split}', mask, '.png')):
                    path = osp.join(tmp, sub, osp.splitext(rel)[0] + ext)
                    os.makedirs(osp.dirname(path), exist_ok=True)
                    Image.fromarray(arr if arr.dtype == np.uint8 else
                                    arr.astype(np.uint8) * 255).save(path, quality=95)
                lines.append(f'{rel} {label}')
            with open(osp.join(tmp, 'meta', f'{split}.txt'), 'w') as f:
                f.write('\n'.join(lines) + '\n')
        os.rename(tmp, args.root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f'{args.root}: {args.num_train} train + {args.num_val} val images of '
          f'{args.img_size} px, {len(FLAGS)} classes, with masks')


if __name__ == '__main__':
    main()
