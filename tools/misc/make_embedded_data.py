"""Generate the embedded "shapes on clutter" data set (deterministic, no download).

Example:
    python tools/misc/make_embedded_data.py --root data/embedded --num-train 2400 --img-size 64
"""
import argparse
import os.path as osp
import sys
import time

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

from mmdinomamba.datasets.embedded import DEFAULTS, generate_embedded_dataset  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--root', default='data/embedded')
    parser.add_argument('--num-train', type=int, default=DEFAULTS['num_train'])
    parser.add_argument('--num-val', type=int, default=DEFAULTS['num_val'])
    parser.add_argument('--img-size', type=int, default=DEFAULTS['img_size'])
    parser.add_argument('--seed', type=int, default=DEFAULTS['seed'])
    args = parser.parse_args(argv)
    start = time.time()
    root = generate_embedded_dataset(args.root, args.num_train, args.num_val, args.img_size,
                                     args.seed, progress=True)
    print(f'embedded data set ready at {root} ({time.time() - start:.1f} s)')


if __name__ == '__main__':
    main()
