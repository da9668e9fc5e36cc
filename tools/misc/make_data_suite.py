"""Write the data suite: small labelled sets of different kinds (grayscale strokes on a plain
background; classes that differ in shape only, in texture only, in colour only; 32-80 px; 5-10
classes), each in the folder layout ``tools/demo.py --data-root`` reads, with masks.

    python tools/misc/make_data_suite.py --root data/suite            # all four sets
    python tools/misc/make_data_suite.py --root data/suite --sets strokes colours
    python tools/demo.py --data-root data/suite/strokes --work-dir work_dirs/demo_strokes

Deterministic (``--seed``); a set whose folder exists is refused (nothing is overwritten).
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

from mmdinomamba.datasets.suite import SUITE, write_suite_set  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--root', required=True, help='parent folder; each set goes in ROOT/<name>')
    p.add_argument('--sets', nargs='+', default=list(SUITE), choices=list(SUITE))
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--num-train', type=int, help='train images per set (default: the set\'s)')
    p.add_argument('--num-val', type=int, help='val images per set (default: the set\'s)')
    args = p.parse_args(argv)
    for name in args.sets:
        if osp.exists(osp.join(args.root, name)):
            raise SystemExit(f'{osp.join(args.root, name)} exists; choose a new --root '
                             '(nothing is overwritten)')
    for name in args.sets:
        write_suite_set(name, osp.join(args.root, name), args.seed, args.num_train,
                        args.num_val)


if __name__ == '__main__':
    main()
