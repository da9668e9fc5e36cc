"""Train-step speed and memory of the official Dino-Mamba model next to our DinoVim, in one run.

The official code is not part of this repository: clone ``yangtiming/Dino-Mamba`` into the
ignored folder ``.external/Dino-Mamba`` and install ``causal-conv1d`` and ``timm`` (the official
bidirectional mixer exists only in ``mamba_ssm``'s fused path, which calls ``causal_conv1d``);
``tools/gpu/README.md`` has the commands. Both models are timed by the same loop as
``tools/analysis/benchmark.py`` (bf16 autocast, AdamW, forward + backward + step, median step
time), with drop path 0 and no classification head::

    python tools/gpu/bench_official.py --repo .external/Dino-Mamba --arch b \
        --res 224 512 1024 --batch 64 16 4

``--dino`` also times DINO's whole multi-crop step (2 global + ``--local-crops`` local crops,
head with 65,536 prototypes, loss, clipping, optimizer, teacher EMA) of the official code
(``tools/gpu/official_dino_step.py``: its ``train_one_epoch`` body; needs its
``main_dino_vim.py`` and DINO's ``vision_transformer.py``) next to ours
(``tools/analysis/benchmark_dino.py``'s step), alternating in the same loop::

    python tools/gpu/bench_official.py --dino --arch b --batch 48 --res 224
"""
import argparse
import importlib
import importlib.util
import os.path as osp
import sys

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

HERE = osp.dirname(osp.abspath(__file__))
ARCH_NAMES = dict(t='tiny', s='small', b='base')


def _benchmark():
    """``tools/analysis/benchmark.py`` as a module (its timing loop)."""
    path = osp.join(osp.dirname(HERE), 'analysis', 'benchmark.py')
    spec = importlib.util.spec_from_file_location('benchmark', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def official_factory(repo: str, arch: str):
    """``res -> model``: the official ``vim_<arch>_patch16_224`` (no head, drop path 0) built for
    inputs of ``res`` pixels, with a clear error for what is missing."""
    if not osp.isfile(osp.join(repo, 'models_vim.py')):
        raise SystemExit(f'bench_official: {repo!r} has no models_vim.py; clone '
                         'yangtiming/Dino-Mamba there (see tools/gpu/README.md)')
    missing = [m for m in ('timm', 'einops', 'causal_conv1d', 'mamba_ssm')
               if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(f'bench_official: the official model needs {", ".join(missing)} '
                         'installed (pip install causal-conv1d timm einops; see '
                         'tools/gpu/README.md)')
    from mmdinomamba.ops.cuda._triton import import_mamba_module
    # mamba_ssm 2.3.2.post1 without its CUDA build: make its kernel modules importable first
    import_mamba_module('mamba_ssm.ops.triton.ssd_combined')
    sys.path.insert(0, osp.abspath(repo))
    factory = getattr(importlib.import_module('models_vim'), f'vim_{ARCH_NAMES[arch]}_patch16_224')

    def build(res: int):
        return factory(num_classes=0, drop_path_rate=0., img_size=res)

    return build


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--repo', default='.external/Dino-Mamba')
    parser.add_argument('--arch', default='b', choices=sorted(ARCH_NAMES))
    parser.add_argument('--res', type=int, nargs='+', default=[224, 512, 1024])
    parser.add_argument('--batch', type=int, nargs='+', default=[64, 16, 4],
                        help='one batch size per --res value')
    parser.add_argument('--iters', type=int, default=10)
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--dino', action='store_true',
                        help="time DINO's multi-crop step (official and ours) instead")
    parser.add_argument('--local-res', type=int, default=96)
    parser.add_argument('--local-crops', type=int, default=10)
    parser.add_argument('--rounds', type=int, default=3)
    args = parser.parse_args(argv)
    if args.dino:
        return dino_main(args)
    if len(args.batch) != len(args.res):
        raise SystemExit(f'--batch: give one value per --res ({len(args.res)}), got {args.batch}')
    build_official = official_factory(args.repo, args.arch)
    if not torch.cuda.is_available():
        raise SystemExit('bench_official: needs a CUDA device (the official code has no CPU '
                         'path)')
    bench = _benchmark()
    ours = f'dinovim-{args.arch}'
    print(f'train step, bf16 autocast, AdamW; iters={args.iters} warmup={args.warmup}')
    print(f'{"model":<22}{"res":>6}{"batch":>6}{"params(M)":>11}{"img/s":>10}{"total MiB":>11}'
          f'{"x official":>12}')
    for res, batch in zip(args.res, args.batch):
        rows = {}
        for name in ('official', ours):
            torch.cuda.empty_cache()
            if name == 'official':
                model = build_official(res).cuda().train()
                optim = torch.optim.AdamW(model.parameters(), lr=1e-6)
                x = torch.randn(batch, 3, res, res, device='cuda')
                rows[name] = bench.time_steps(model, optim, x, 'train', 'cuda', args.iters,
                                              args.warmup, True)
                del model, optim, x
            else:
                rows[name] = bench.measure(ours, res, 'train', batch, 'cuda', args.iters,
                                           args.warmup, True)
            r, ref = rows[name], rows['official']
            label = f'Dino-Mamba vim_{ARCH_NAMES[args.arch]}' if name == 'official' else ours
            print(f'{label:<22}{res:>6}{batch:>6}{r["params"]:>11.2f}{r["imgs"]:>10.1f}'
                  f'{r["mem_total"]:>11.0f}{r["imgs"] / ref["imgs"]:>12.2f}', flush=True)


def _load(name: str):
    """A sibling script of ``tools/`` as a module."""
    path = osp.join(osp.dirname(HERE), *name.split('/'))
    spec = importlib.util.spec_from_file_location(osp.basename(name)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dino_main(args) -> None:
    """DINO's step, official against ours, one batch and resolution, rounds alternating."""
    import statistics
    import time
    official = _load('gpu/official_dino_step.py')
    lost = official.missing_files(args.repo)
    if lost:
        raise SystemExit(f'bench_official --dino: {args.repo!r} lacks {", ".join(lost)} (the '
                         'official DINO loop; see tools/gpu/README.md)')
    if not torch.cuda.is_available():
        raise SystemExit('bench_official --dino: needs a CUDA device')
    official_factory(args.repo, args.arch)  # checks the packages, imports mamba_ssm's kernels
    batch, res = args.batch[0], args.res[0]
    theirs, n_theirs = official.build_official_dino_step(
        args.repo, f'vim_{ARCH_NAMES[args.arch]}_patch16_224', batch, res, args.local_res,
        args.local_crops)
    ours_mod = _load('analysis/benchmark_dino.py')
    ours_args = ours_mod.parse_args(['--archs', f'dinovim-{args.arch}', '--batch', str(batch),
                                     '--res', str(res), '--local-res', str(args.local_res),
                                     '--local-crops', str(args.local_crops), '--amp',
                                     '--device', 'cuda', '--iters', str(args.iters),
                                     '--warmup', str(args.warmup), '--rounds',
                                     str(args.rounds)])
    ours, _, _ = ours_mod.build_step(f'dinovim-{args.arch}', ours_args, 'cuda')
    steps = dict(official=lambda i: theirs(), ours=ours)
    for name, fn in steps.items():
        for i in range(args.warmup):
            fn(i)
    torch.cuda.synchronize()
    rates = {name: [] for name in steps}
    for r in range(args.rounds):
        for name in (list(steps) if r % 2 == 0 else list(steps)[::-1]):
            t0 = time.perf_counter()
            for i in range(args.iters):
                steps[name](args.warmup + r * args.iters + i)
            torch.cuda.synchronize()
            rates[name].append(batch * args.iters / (time.perf_counter() - t0))
    ratio = statistics.median(a / b for a, b in zip(rates['ours'], rates['official']))
    print(f'DINO step, 2 x {res} + {args.local_crops} x {args.local_res} px, batch {batch}, '
          f'bf16; {args.rounds} rounds x {args.iters} iters')
    print(f'official vim_{ARCH_NAMES[args.arch]} ({n_theirs / 1e6:.1f}M): '
          f'{statistics.median(rates["official"]):.1f} img/s')
    print(f'ours dinovim-{args.arch}: {statistics.median(rates["ours"]):.1f} img/s, '
          f'{ratio:.2f} x official')


if __name__ == '__main__':
    main()
