"""Generate the embedded "objects on dead leaves" data set (deterministic, no download).

An existing data set with the same parameters is kept as it is; one made with other parameters is
an error naming both values, unless ``--overwrite`` is given. A folder that is not an embedded
data set is never written into.

Example:
    python tools/misc/make_embedded_data.py --root data/embedded --num-train 2400 --img-size 64
"""
import argparse
import os.path as osp
import sys
import time

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

from mmdinomamba.datasets.embedded import (DEFAULTS, EmbeddedDataMismatchError,  # noqa: E402
                                           generate_embedded_dataset)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--root', default='data/embedded')
    parser.add_argument('--num-train', type=int, default=DEFAULTS['num_train'])
    parser.add_argument('--num-val', type=int, default=DEFAULTS['num_val'])
    parser.add_argument('--img-size', type=int, default=DEFAULTS['img_size'])
    parser.add_argument('--seed', type=int, default=DEFAULTS['seed'])
    parser.add_argument('--overwrite', action='store_true',
                        help='replace an existing embedded data set made with other parameters')
    args = parser.parse_args(argv)
    start = time.time()
    try:
        root = generate_embedded_dataset(args.root, args.num_train, args.num_val, args.img_size,
                                         args.seed, progress=True, overwrite=args.overwrite,
                                         owner='make_embedded_data')
    except (EmbeddedDataMismatchError, FileExistsError) as e:
        raise SystemExit(str(e)) from e
    print(f'embedded data set ready at {root} ({time.time() - start:.1f} s)')


if __name__ == '__main__':
    main()
