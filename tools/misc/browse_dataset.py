"""Write a PNG grid of embedded (or any COCO-format) images with masks, boxes and labels.

Each tile shows the image with its instance polygons and boxes (class names on top) and, beside it,
the binary foreground mask and the semantic class map, so a person can check every annotation
layout of the embedded data at a glance.

Example:
    python tools/misc/browse_dataset.py --root data/embedded --split val --num 16 --out grid.png
"""
import argparse
import colorsys
import json
import os.path as osp
import sys

import numpy as np
from PIL import Image, ImageDraw

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))


def palette(n):
    return [tuple(int(255 * c) for c in colorsys.hsv_to_rgb(i / n, 0.9, 1.0)) for i in range(n)]


def render_tile(root, split, image_info, anns, cats, scale):
    ade = 'training' if split == 'train' else 'validation'
    name = image_info['file_name']
    img = Image.open(osp.join(root, 'coco', split, name)).convert('RGB')
    w, h = img.size
    img = img.resize((w * scale, h * scale), Image.NEAREST)
    colors = palette(len(cats))
    draw = ImageDraw.Draw(img)
    for ann in anns:
        color = colors[ann['category_id'] - 1]
        for poly in ann['segmentation']:
            pts = [(x * scale, y * scale) for x, y in zip(poly[0::2], poly[1::2])]
            draw.polygon(pts, outline=color)
        x, y, bw, bh = (v * scale for v in ann['bbox'])
        draw.rectangle([x, y, x + bw, y + bh], outline=color)
        draw.text((x + 2, max(0, y - 11)), cats[ann['category_id']], fill=color)
    sem = np.asarray(Image.open(osp.join(root, 'seg', 'annotations', ade, name)))
    sem_rgb = np.zeros((*sem.shape, 3), np.uint8)
    for k, color in enumerate(colors):
        sem_rgb[sem == k + 1] = color
    fg = np.repeat(((sem > 0) * 255).astype(np.uint8)[..., None], 3, -1)
    side = [Image.fromarray(a).resize((w * scale, h * scale), Image.NEAREST) for a in (fg, sem_rgb)]
    tile = Image.new('RGB', (3 * w * scale + 4, h * scale), (255, 255, 255))
    for i, part in enumerate([img] + side):
        tile.paste(part, (i * (w * scale + 2), 0))
    return tile


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--root', default='data/embedded')
    parser.add_argument('--split', default='val', choices=['train', 'val'])
    parser.add_argument('--num', type=int, default=16)
    parser.add_argument('--cols', type=int, default=2)
    parser.add_argument('--scale', type=int, default=3)
    parser.add_argument('--out', default='work_dirs/browse_dataset.png')
    args = parser.parse_args(argv)
    ann_file = osp.join(args.root, 'coco', 'annotations', f'instances_{args.split}.json')
    if not osp.isfile(ann_file):
        raise FileNotFoundError(f'{ann_file} not found: generate the data first with '
                                'python tools/misc/make_embedded_data.py')
    with open(ann_file) as f:
        coco = json.load(f)
    cats = {c['id']: c['name'] for c in coco['categories']}
    by_image = {}
    for ann in coco['annotations']:
        by_image.setdefault(ann['image_id'], []).append(ann)
    tiles = [render_tile(args.root, args.split, info, by_image.get(info['id'], []), cats,
                         args.scale) for info in coco['images'][:args.num]]
    tw, th = tiles[0].size
    rows = (len(tiles) + args.cols - 1) // args.cols
    grid = Image.new('RGB', (args.cols * (tw + 8), rows * (th + 8)), (255, 255, 255))
    for i, tile in enumerate(tiles):
        grid.paste(tile, ((i % args.cols) * (tw + 8), (i // args.cols) * (th + 8)))
    import os
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    grid.save(args.out)
    print(f'wrote {args.out} ({len(tiles)} images)')


if __name__ == '__main__':
    main()
