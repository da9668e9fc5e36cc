"""Throughput of ``BinaryAUC.calculate`` on CPU (maps per second).

    python tools/analysis/benchmark_auc.py [--grids 14 32] [--num-maps 20000] [--threads 1]
        [--device cpu|cuda]

Random maps (ties included: values quantized to 1/255) and random masks; prints maps/s for the
exact AUC and the 101-threshold sweep, and the speed-up over a per-map
``sklearn.metrics.roc_auc_score`` loop. Goal: >= 10,000 maps/s at 14x14 (ImageNet-S val:
12,419 images x layers x heads).
"""
import argparse
import time

import torch

from mmdinomamba.evaluation import BinaryAUC


def _rate(fn, n, repeats):
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    fn()  # warm-up
    best = float('inf')
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return n / best


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--grids', type=int, nargs='+', default=[14, 32])
    parser.add_argument('--num-maps', type=int, default=20000)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--sklearn-maps', type=int, default=300)
    parser.add_argument('--device', default='cpu')
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    print(f'torch {torch.__version__}, {args.device}, {args.threads} CPU thread(s), '
          f'{args.num_maps} maps per run')
    for grid in args.grids:
        maps = (torch.rand(args.num_maps, grid, grid, generator=g) * 255).round() / 255
        masks = torch.rand(args.num_maps, grid, grid, generator=g) < 0.4
        maps, masks = maps.to(args.device), masks.to(args.device)
        exact = _rate(lambda: BinaryAUC.calculate(maps, masks), args.num_maps, args.repeats)
        sweep = _rate(lambda: BinaryAUC.calculate(maps, masks, num_thresholds=101),
                      args.num_maps, args.repeats)
        line = (f'{grid}x{grid}: exact {exact:,.0f} maps/s, sweep(101) {sweep:,.0f} maps/s')
        try:
            from sklearn.metrics import roc_auc_score
            k = args.sklearn_maps
            m, y = maps[:k].flatten(1).cpu().numpy(), masks[:k].flatten(1).cpu().numpy()
            ref = _rate(lambda: [roc_auc_score(y[i], m[i]) for i in range(k)], k, 1)
            line += f', sklearn loop {ref:,.0f} maps/s (exact is {exact / ref:.0f}x faster)'
        except ImportError:
            pass
        print(line)


if __name__ == '__main__':
    main()
