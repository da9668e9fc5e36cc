"""DINO's real training step, timed: multi-crop teacher and student, head, loss, clipping,
optimizer and teacher EMA, for any backbone preset next to its ViT peer in one process.

One step is what a training iteration of the DINO configs does after the data loader: the data
preprocessor (uint8 crops to the device, normalized), the teacher on the 2 global crops, the
student on the global and local crops (one backbone call per crop size), the 65,536-prototype
head, the loss, DINO's per-parameter gradient clipping, AdamW and the EMA update of the teacher
(``DINO.train_step`` with the DINO optimizer wrapper, then ``update_teacher``). The default crops
are the paper's: 2 x 224 and 10 x 96 px. Models alternate round by round (the first model of a
round changes every round), each round times ``--iters`` steps with one device wait at the end;
img/s counts images (not crops); the ratio is the median of the per-round ratios to the peer::

    python tools/analysis/benchmark_dino.py --archs dinovim-b --batch 64 --amp
    python tools/analysis/benchmark_dino.py --archs dinovim-t --batch 8 --device cpu --iters 3
"""
import argparse
import logging
import os.path as osp
import statistics
import sys
import time

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import mmdinomamba  # noqa: E402,F401  (registers the modules)
from mmdinomamba.models.backbones.presets import BACKBONE_PRESETS  # noqa: E402

MEAN, STD = [123.675, 116.28, 103.53], [58.395, 57.12, 57.375]


def peer_of(name: str) -> str | None:
    """The ViT of the same size (``-b`` -> vit-b, else vit-s); None for a ViT itself."""
    if name.startswith('vit-'):
        return None
    return 'vit-b' if name.endswith('-b') else 'vit-s'


def backbone_cfg(name: str, res: int, width: int | None = None,
                 depth: int | None = None) -> dict:
    """The preset's backbone config for ``res`` px (stochastic depth 0.1, as in the DINO
    configs), optionally narrowed to ``width`` channels and ``depth`` layers."""
    from mmpretrain.registry import MODELS
    if name not in BACKBONE_PRESETS:
        raise SystemExit(f'benchmark_dino: unknown arch {name!r}; choose from '
                         f'{sorted(BACKBONE_PRESETS)}')
    cfg = dict(BACKBONE_PRESETS[name], img_size=res, drop_path_rate=0.1)
    if width is None and depth is None:
        return cfg
    arch = dict(MODELS.get(cfg['type']).arch_zoo[cfg['arch']])
    if 'embed_dims' not in arch or 'num_layers' not in arch:
        raise SystemExit(f'benchmark_dino: --width / --depth need an arch with embed_dims and '
                         f'num_layers; {name} has {sorted(arch)}')
    if width is not None:
        arch['embed_dims'] = width
        if 'num_heads' in arch:
            arch['num_heads'] = max(1, width // 64)
    if depth is not None:
        arch['num_layers'] = depth
    cfg['arch'] = arch
    return cfg


def build_step(name: str, args, device: str):
    """``(step, model, wrapper)``: ``step(i)`` runs training iteration ``i`` of the model."""
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import MODELS
    bb = backbone_cfg(name, args.res, args.width, args.depth)
    model = MODELS.build(_dino_cfg(bb, args))
    model.init_weights()
    model.to(device).train()
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        wrapper = _optim_wrapper(build_optim_wrapper, model, args)
    wrapper.defer_scalars = True  # as in training with DINORuntimeInfoHook

    pin = device.startswith('cuda')
    g = torch.Generator().manual_seed(0)

    def crops(n: int, size: int) -> list:
        return [torch.randint(0, 256, (args.batch, 3, size, size), dtype=torch.uint8,
                              generator=g).pin_memory() if pin else
                torch.randint(0, 256, (args.batch, 3, size, size), dtype=torch.uint8,
                              generator=g) for _ in range(n)]

    data = dict(inputs=crops(2, args.res) + crops(args.local_crops, args.local_res),
                data_samples=None)
    max_iters = args.warmup + args.iters * args.rounds

    def step(i: int) -> None:
        model.set_progress(min(i, max_iters), max_iters, max(max_iters, 1))
        model.train_step(data, optim_wrapper=wrapper)
        model.update_teacher()
        wrapper.pop_pending_scalars()  # the logged norm is not read: no host wait

    return step, model, wrapper


def _optim_wrapper(build, model, args):
    """The DINO configs' optimizer: AdamW, no decay on 1-D parameters, clipping 3.0 per
    parameter, bf16 autocast without a GradScaler with ``--amp``."""
    return build(model, dict(
        type='DINOAmpOptimWrapper' if args.amp else 'DINOOptimWrapper',
        **(dict(dtype='bfloat16') if args.amp else {}),
        constructor='DINOOptimWrapperConstructor',
        optimizer=dict(type='AdamW', lr=5e-4, betas=(0.9, 0.999), weight_decay=0.04),
        paramwise_cfg=dict(flat_decay_mult=0.),
        clip_grad=dict(max_norm=3.0, per_param=True)))


def _dino_cfg(bb: dict, args) -> dict:
    from mmpretrain.registry import MODELS
    width = bb['arch']['embed_dims'] if isinstance(bb['arch'], dict) else \
        MODELS.get(bb['type']).arch_zoo[bb['arch']]['embed_dims']
    cfg = dict(
        type='DINO', backbone=bb,
        head=dict(type='DINOHead', in_channels=width, out_channels=args.out_dim,
                  hidden_channels=args.hidden_dim, bottleneck_channels=args.bottleneck_dim),
        data_preprocessor=dict(type='DINODataPreprocessor', mean=MEAN, std=STD, to_rgb=True,
                               non_blocking=True),
        freeze_last_layer=0)  # the step of every epoch after the first
    if args.cuda_graphs:
        cfg['cuda_graphs'] = True
    return cfg


def _sync(device: str) -> None:
    if device.startswith('cuda'):
        torch.cuda.synchronize()


def run(args) -> list[dict]:
    """One row per model: img/s (median over rounds), peak memory, ratio to the peer."""
    names = []
    for name in args.archs:
        for n in (name, None if args.no_peer else peer_of(name)):
            if n is not None and n not in names:
                names.append(n)
    steps = {}
    for name in names:
        step, model, _ = build_step(name, args, args.device)
        for i in range(args.warmup):
            step(i)
        _sync(args.device)
        steps[name] = dict(step=step, params=sum(p.numel() for p in model.backbone.parameters()),
                           rates=[], mem=0.)
    images = args.batch * args.iters
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            s = steps[name]
            if args.device.startswith('cuda'):
                torch.cuda.reset_peak_memory_stats()
            _sync(args.device)
            t0 = time.perf_counter()
            for i in range(args.iters):
                s['step'](args.warmup + r * args.iters + i)
            _sync(args.device)
            s['rates'].append(images / (time.perf_counter() - t0))
            if args.device.startswith('cuda'):
                s['mem'] = max(s['mem'], torch.cuda.max_memory_allocated() / 2**20)
    rows = []
    for name in names:
        s, peer = steps[name], peer_of(name)
        row = dict(arch=name, params=s['params'] / 1e6, imgs=statistics.median(s['rates']),
                   mem=s['mem'], peer=peer if peer in steps else None, ratio=None)
        if row['peer']:
            row['ratio'] = statistics.median(a / b for a, b in zip(s['rates'],
                                                                    steps[peer]['rates']))
        rows.append(row)
    return rows


def format_rows(rows: list[dict], args) -> str:
    head = (f'DINO step: 2 x {args.res} + {args.local_crops} x {args.local_res} px, batch '
            f'{args.batch}, K={args.out_dim}, {"bf16 autocast" if args.amp else "fp32"}, '
            f'{args.device}; {args.rounds} rounds x {args.iters} iters (warm-up {args.warmup})')
    lines = [head, f'{"arch":<16}{"params(M)":>10}{"img/s":>10}{"peak MiB":>10}{"x peer":>9}']
    for r in rows:
        ratio = f'  {r["ratio"]:.2f} ({r["peer"]})' if r['ratio'] is not None else '  -'
        lines.append(f'{r["arch"]:<16}{r["params"]:>10.2f}{r["imgs"]:>10.3g}{r["mem"]:>10.0f}'
                     f'{ratio}')
    return '\n'.join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--archs', nargs='+', default=['dinovim-b'], choices=sorted(BACKBONE_PRESETS))
    p.add_argument('--batch', type=int, default=64 if torch.cuda.is_available() else 4,
                   help='images per step (each gives 2 global and --local-crops local crops)')
    p.add_argument('--res', type=int, default=224, help='global crop size')
    p.add_argument('--local-res', type=int, default=96, help='local crop size')
    p.add_argument('--local-crops', type=int, default=10)
    p.add_argument('--iters', type=int, default=10, help='timed steps per round')
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--warmup', type=int, default=3)
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    p.add_argument('--amp', action='store_true', help='bfloat16 autocast (no GradScaler)')
    p.add_argument('--cuda-graphs', action='store_true',
                   help="the DINO model's cuda_graphs switch (CUDA only)")
    p.add_argument('--out-dim', type=int, default=65536, help='prototypes K')
    p.add_argument('--hidden-dim', type=int, default=2048)
    p.add_argument('--bottleneck-dim', type=int, default=256)
    p.add_argument('--width', type=int, help='override the arch width (small test runs)')
    p.add_argument('--depth', type=int, help='override the number of layers')
    p.add_argument('--no-peer', action='store_true', help='do not time the ViT peer')
    args = p.parse_args(argv)
    for key in ('batch', 'res', 'local_res', 'iters', 'rounds'):
        if getattr(args, key) < 1:
            p.error(f'--{key.replace("_", "-")} must be >= 1, got {getattr(args, key)}')
    if args.local_crops < 0 or args.warmup < 0:
        p.error('--local-crops and --warmup must be >= 0')
    if args.device.startswith('cuda') and not torch.cuda.is_available():
        p.error(f'--device {args.device}: CUDA is not available')
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    from mmengine.logging import MMLogger
    logger = MMLogger.get_instance('mmengine')
    level = logger.level
    logger.setLevel(logging.WARNING)  # no per-parameter build logs
    try:
        rows = run(args)
    finally:
        logger.setLevel(level)
    print(format_rows(rows, args), flush=True)
    return rows


if __name__ == '__main__':
    main()
