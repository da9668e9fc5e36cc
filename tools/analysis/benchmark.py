"""Throughput and peak memory of the backbones, forward and forward+backward.

Each backbone is measured at each resolution in the same run, and its numbers are printed next to
the ratio to the ViT of the same size (``-t``/``-s`` models -> ViT-S, ``-b`` -> ViT-B; ``--ref``
picks one reference for all) measured in that run. Throughput = images / second over
``--iters`` timed iterations after ``--warmup``. Peak memory (activations, gradients and
workspace; model and input excluded): CUDA -> ``torch.cuda.max_memory_allocated`` minus what
was allocated before the first step (the whole peak is printed as ``total MiB``); CPU -> peak
resident set size minus the resident size before the first step (each CPU case runs in its own
process, so the peak is its own). ``--rounds N`` measures the models N times, alternating, and
keeps each one's best img/s: on a shared machine a slow spell then cannot fall on one model only.
Where the machine's speed drifts between processes (a 2-core cloud VM: the same model 30% apart
an hour later), ``--interleave R`` also runs the models of each case in one process, in turn
(the order reversed every other round), ``--iters`` steps each, R rounds, and takes the speed
ratio as the median of the rounds' ratios; the table then shows that median's 95% confidence
interval (distribution-free, from 6 rounds on: whether a ratio is above 1 beyond the machine's
noise), the rounds' range and the separate processes' ratio beside it.

Modes: ``fwd`` (inference), ``fwd+bwd``, ``train`` (plus an AdamW step) and ``dino``: the
training step of DINO on CPU, a teacher forward (no gradients) of the batch (the global crops)
and a student forward and backward of it and of twice as many crops of half the size (the local
crops); its img/s counts global crops. ``--batch 64 --res 64`` with the ``-demo`` models is the
step of the CPU demo (batch 32 x 2 global crops of 64 px, 4 local crops of 32 px).

Example::

    python tools/analysis/benchmark.py --device cpu --archs vit-s dinovim-t --res 224 --batch 2
    python tools/analysis/benchmark.py --device cpu --archs dinovim-demo --res 64 --batch 64 \
        --modes fwd+bwd dino     # the demo's model, compared with a ViT of equal width / depth
    python tools/analysis/benchmark.py --device cuda --res 224 512 1024 --batch 8 --amp
    python tools/analysis/benchmark.py --device cuda --amp --batch 64 --iters 3 \
        --profile dinovim-b 224 train --trace dinovim-b.json     # where does the time go?
    python tools/analysis/benchmark.py --device cpu --batch 8 --iters 3 --keep-freed-memory \
        --breakdown dinovim-t 224 fwd+bwd      # the mixer's pieces, timed inside whole steps
    python tools/analysis/benchmark.py --device cpu --archs dinovim-t --res 224 --batch 8 \
        --modes fwd+bwd --iters 3 --keep-freed-memory --interleave 8   # ratio in one process

A/B comparisons of two versions of the code are runs of this tool at two git revisions.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mmdinomamba.models.backbones.presets import BACKBONE_PRESETS  # noqa: E402
from mmdinomamba.utils.bench_stats import (best_of, interval_text, paired_ratio,  # noqa: E402
                                           round_order)

ARCHS = {
    **BACKBONE_PRESETS,
    # the CPU demo's DinoVim (64 wide, 4 layers, patch 8) and a ViT of equal width and depth
    'vit-demo': dict(type='ViT', arch=dict(embed_dims=64, num_layers=4, num_heads=4),
                     img_size=64, patch_size=8),
    'dinovim-demo': dict(type='DinoVim', arch=dict(embed_dims=64, num_layers=4),
                         mixer_cfg=dict(d_state=16, headdim=16), img_size=64, patch_size=8),
}
#: the models measured when --archs is not given
DEFAULT_ARCHS = ('vit-s', 'vit-b', 'linearvit-b', 'dinovim-t', 'dinovim-s', 'dinovim-b',
                 'mambareg-b', 'mila-t', 'mila-s', 'mila-b')
# fwd: inference; fwd+bwd: forward and backward; train: forward, backward and an AdamW step;
# dino: DINO's step (see the module docstring).
MODES = ('fwd', 'fwd+bwd', 'train', 'dino')


def reference_of(name: str, ref: str | None = None) -> str:
    """The model ``name`` is compared with: ``ref`` if given, else the ViT of its size (``t``
    compared with ViT-S, ``-demo`` with the demo-sized ViT)."""
    if ref:
        return ref
    if name.endswith('-demo'):
        return 'vit-demo'
    return 'vit-b' if name.endswith('-b') else 'vit-s'


def build_options(args) -> dict:
    """Backbone options from the command line: ``mixer`` (the Mamba mixers' chunk size and
    ``recompute_merge``, constructor arguments) and ``with_cp`` (activation checkpointing per
    block)."""
    mixer = dict(chunk_size=args.chunk_size) if args.chunk_size else {}
    if args.recompute_merge:
        mixer['recompute_merge'] = True
    return dict(mixer=mixer, with_cp=args.with_cp)


def _build(name: str, device: str, options: dict | None = None):
    from mmdinomamba.models import backbones
    options = options or {}
    cfg = dict(ARCHS[name])
    if options.get('mixer') and cfg['type'] in ('DinoVim', 'MambaReg'):
        cfg['mixer_cfg'] = {**cfg.get('mixer_cfg', {}), **options['mixer']}
    if options.get('with_cp'):
        cfg['with_cp'] = True
    return getattr(backbones, cfg.pop('type'))(**cfg, drop_path_rate=0.).to(device)


def _sync(device: str) -> None:
    if device.startswith('cuda'):
        torch.cuda.synchronize()


def _outputs(model, x) -> list:
    out = model(x)
    return [out] if torch.is_tensor(out) else list(out)


def _step(model, x, mode: str, amp: bool, optim=None) -> None:
    """One step on ``x`` (the global crops and, in 'dino' mode, the local ones)."""
    x, local = (x, None) if torch.is_tensor(x) else x
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=amp):
        if mode in ('fwd', 'dino'):
            with torch.no_grad():
                model(x)  # inference / the teacher
            if mode == 'fwd':
                return
        out = _outputs(model, x) + (_outputs(model, local) if mode == 'dino' else [])
    sum(o.float().sum() for o in out).backward()
    if optim is not None:
        optim.step()
    model.zero_grad(set_to_none=True)


def _current_rss_kib() -> float:
    """Resident set size of this process now, in KiB (Linux ``/proc/self/statm``)."""
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 1024


def _setup(name: str, res: int, mode: str, batch: int, device: str, compile_model: bool,
           options: dict | None):
    """Model (in the mode's train/eval state), optimizer (train mode only) and input, the same
    in every run (seeded: the work of the quadratic scan depends on the weights, through how
    many heads decay too strongly to factor)."""
    torch.manual_seed(0)
    model = _build(name, device, options)
    model.train(mode != 'fwd')
    if compile_model:  # torch.compile the glue around the kernels
        model = torch.compile(model)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-6) if mode == 'train' else None
    x = torch.randn(batch, 3, res, res, device=device)
    if mode == 'dino':
        x = (x, torch.randn(2 * batch, 3, res // 2, res // 2, device=device))
    return model, optim, x


def measure(name: str, res: int, mode: str, batch: int, device: str, iters: int, warmup: int,
            amp: bool, compile_model: bool = False, options: dict | None = None) -> dict:
    """Time ``iters`` steps of one model; returns img/s, peak memory (MiB) and params (M).
    ``options``: see :func:`build_options`."""
    model, optim, x = _setup(name, res, mode, batch, device, compile_model, options)
    return time_steps(model, optim, x, mode, device, iters, warmup, amp)


def time_steps(model, optim, x, mode: str, device: str, iters: int, warmup: int,
               amp: bool) -> dict:
    """img/s (median step time), peak memory (MiB) beyond what was allocated before the first
    step, and params (M) of ``model`` on input ``x`` (any model whose output is a tensor or a
    tuple of tensors; ``optim`` only in 'train' mode; a pair of global and local crops in 'dino'
    mode, whose img/s counts the global crops)."""
    batch = (x if torch.is_tensor(x) else x[0]).shape[0]
    _sync(device)
    if device.startswith('cuda'):
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _current_rss_kib()
    for _ in range(warmup):
        _step(model, x, mode, amp, optim)
    _sync(device)
    elapsed = iters * _median_step(model, optim, x, mode, device, iters, amp)
    total = float('nan')
    if device.startswith('cuda'):
        total = torch.cuda.max_memory_allocated() / 2**20  # with the model and input
        peak = total - base / 2**20
    else:  # ru_maxrss is in KiB on Linux
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    params = sum(p.numel() for p in model.parameters()) / 1e6
    return dict(imgs=batch * iters / elapsed, mem=peak, mem_total=total, params=params,
                batch=batch)


def _median_step(model, optim, x, mode: str, device: str, iters: int, amp: bool) -> float:
    """The median time (s) of ``iters`` steps: robust to one slow step."""
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        _step(model, x, mode, amp, optim)
        _sync(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _single_case(args, flag: str) -> tuple:
    """The one case ``--profile`` or ``--breakdown`` (``flag``) names, ``ARCH RES MODE``, set up:
    its name, resolution, mode and batch, the model, optimizer (train mode only) and input."""
    name, res, mode = getattr(args, flag)[0], int(getattr(args, flag)[1]), getattr(args, flag)[2]
    if mode not in MODES:
        raise SystemExit(f'--{flag}: mode {mode!r} is not one of {MODES}')
    options, batch = build_options(args), _batch_for(args, res)
    model, optim, x = _setup(name, res, mode, batch, args.device, args.compile, options)
    return name, res, mode, batch, model, optim, x


def profile(args, rows: int = 25) -> str:
    """Profile ``--iters`` steps of the one case ``--profile ARCH RES MODE`` (after
    ``--warmup``) with ``torch.profiler``; returns the table of the most expensive operators
    (by self CUDA time on CUDA, self CPU time otherwise) and writes a Chrome trace if asked."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    _, _, mode, _, model, optim, x = _single_case(args, 'profile')
    cuda = args.device.startswith('cuda')
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    for _ in range(args.warmup):
        _step(model, x, mode, args.amp, optim)
    _sync(args.device)
    with torch_profile(activities=activities) as prof:
        for _ in range(args.iters):
            _step(model, x, mode, args.amp, optim)
        _sync(args.device)
    if args.trace:
        prof.export_chrome_trace(args.trace)
    key = 'self_cuda_time_total' if cuda else 'self_cpu_time_total'
    return prof.key_averages().table(sort_by=key, row_limit=rows)


#: --breakdown: the pieces of BiSSD's CPU kernels inside a whole training step, each as the
#: names of the ``record_function`` ranges the ops open (mmdinomamba.ops.cpu); indented rows
#: are inside the row above them
BREAKDOWN = (
    ('mixer between its projections, forward', 0, ['bidir_ssd.forward']),
    ('mixer between its projections, backward', 0, ['bidir_ssd.backward']),
    ('SSD scan, forward and backward', 1, ['bidir_ssd.scan']),
    ('(L, L) products and the work fused with them', 2, ['bidir_ssd.scan.products']),
    ('strongly decaying heads, one by one', 2, ['bidir_ssd.scan.wide_heads']),
    ("both directions' convs + SiLU", 1, ['bidir_ssd.conv']),
    ('gated RMSNorms and their average', 1, ['bidir_ssd.merge']),
)


def breakdown(args) -> str:
    """Time the pieces of BiSSD's CPU kernels (:data:`BREAKDOWN`) inside ``--iters`` whole
    steps of the one case ``--breakdown ARCH RES MODE`` (after ``--warmup``), from the
    ``record_function`` ranges the ops open, read by ``torch.profiler`` (which slows the small
    operators of a step somewhat: the shares are more telling than the milliseconds); returns
    a table of ms per step and share of the step."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    name, res, mode, batch, model, optim, x = _single_case(args, 'breakdown')
    for _ in range(args.warmup):
        _step(model, x, mode, args.amp, optim)
    start = time.perf_counter()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.iters):
            _step(model, x, mode, args.amp, optim)
    step = (time.perf_counter() - start) / args.iters
    totals = {}  # microseconds per range name, over all steps
    for event in prof.events():
        totals[event.name] = totals.get(event.name, 0.) + event.cpu_time_total
    spent = [sum(totals.get(n, 0.) for n in names) / 1e6 / args.iters
             for _, _, names in BREAKDOWN]
    lines = [f'{name} {res}px {mode}, batch {batch}, {args.iters} steps: '
             f'{1000 * step:.0f} ms a step (mean, profiled)',
             f'{"piece":<50}{"ms/step":>10}{"share":>8}']
    for (label, depth, _), t in zip(BREAKDOWN, spent):
        lines.append(f'{"  " * depth + label:<50}{1000 * t:>10.1f}{t / step:>8.0%}')
    rest = step - spent[0] - spent[1]
    lines.append(f'{"rest: projections, norms, residuals, other layers":<50}{1000 * rest:>10.1f}'
                 f'{rest / step:>8.0%}')
    if not spent[0] + spent[1]:
        lines.append('(the mmdinomamba::bidir_ssd op did not run: no BiSSD mixer, or its '
                     'sequences too long for the quadratic form, which then runs as separate '
                     'ops)')
    return '\n'.join(lines)


def _batch_for(args, res: int) -> int:
    if len(args.batch) == 1:
        return args.batch[0]
    if len(args.batch) != len(args.res):
        raise SystemExit(f'--batch: give one value or one per --res ({len(args.res)}), '
                         f'got {args.batch}')
    return args.batch[args.res.index(res)]


def _run_case(args, name: str, res: int, mode: str) -> dict:
    """Measure one case: in-process on CUDA, in a fresh process on CPU (own peak RSS)."""
    batch = _batch_for(args, res)
    if args.device.startswith('cuda'):
        try:
            return measure(name, res, mode, batch, args.device, args.iters, args.warmup,
                           args.amp, args.compile, build_options(args))
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            return dict(imgs=float('nan'), mem=float('nan'), mem_total=float('nan'),
                        params=float('nan'), batch=batch)
    cmd = [sys.executable, __file__, '--one', name, str(res), mode, '--batch', str(batch),
           '--device', args.device, '--iters', str(args.iters), '--warmup', str(args.warmup)]
    cmd += ['--amp'] if args.amp else []
    cmd += ['--compile'] if args.compile else []
    for flag in ('with_cp', 'keep_freed_memory', 'recompute_merge'):
        cmd += ['--' + flag.replace('_', '-')] if getattr(args, flag) else []
    cmd += ['--chunk-size', str(args.chunk_size)] if args.chunk_size else []
    done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    if done.returncode:
        raise RuntimeError(f'{name} {res} {mode} failed:\n{done.stderr[-2000:]}')
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(args) -> list[dict]:
    names = list(args.archs)
    for ref in {reference_of(n, args.ref) for n in names}:  # measured in the same run
        if ref not in names:
            names.insert(0, ref)
    rows = []
    for res in args.res:
        for mode in args.modes:
            runs = {n: [] for n in names}
            for _ in range(args.rounds):  # the models alternate: a slow spell hits each
                for n in names:  # nan = out of memory
                    runs[n].append(_run_case(args, n, res, mode))
                    print(f'[{n} {res}px {mode}] {json.dumps(runs[n][-1])}',
                          file=sys.stderr, flush=True)
            results = {n: best_of(r) for n, r in runs.items()}
            paired = _interleaved_or_none(args, names, res, mode, results)
            for n in names:
                r, ref = results[n], results[reference_of(n, args.ref)]
                row = dict(arch=n, res=res, mode=mode, **r, ref=reference_of(n, args.ref),
                           speed_ratio=r['imgs'] / ref['imgs'],
                           mem_ratio=r['mem'] / max(ref['mem'], 1e-9))
                if paired is not None:
                    row['speed_ratio_processes'] = row['speed_ratio']
                    row.update(paired_ratio(paired, n, reference_of(n, args.ref)))
                rows.append(row)
    return rows


def _interleaved_or_none(args, names: list[str], res: int, mode: str,
                         results: dict) -> dict | None:
    """:func:`interleaved` if asked for and every model ran in its own process; None (the
    processes' ratios stand, and a line on stderr says why) when one of them, or all of them
    together, ran out of memory."""
    if not args.interleave:
        return None
    if any(r['imgs'] != r['imgs'] for r in results.values()):  # nan: out of memory
        print(f'[{res}px {mode}] --interleave skipped: a model ran out of memory',
              file=sys.stderr)
        return None
    try:
        return interleaved(args, names, res, mode)
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        print(f'[{res}px {mode}] --interleave skipped: out of memory with every model in one '
              'process', file=sys.stderr)
        return None


def interleaved(args, names: list[str], res: int, mode: str) -> dict:
    """``--interleave R``: every model of the case set up in this one process (as
    :func:`measure` does, seeded) and, after ``--warmup`` steps each, ``R`` rounds in which
    each model in turn runs ``--iters`` steps; returns each model's median step time (s) per
    round. A slow spell of a shared machine then falls on the models of one round alike,
    where separate processes minutes apart can see different machines. The order within a
    round is reversed every other round (:func:`round_order`), so that no model always runs
    first or always after the same other one."""
    options, batch = build_options(args), _batch_for(args, res)
    cases = {n: _setup(n, res, mode, batch, args.device, args.compile, options) for n in names}
    times = {n: [] for n in names}
    for n, (model, optim, x) in cases.items():
        for _ in range(args.warmup):
            _step(model, x, mode, args.amp, optim)
    _sync(args.device)
    for i in range(args.interleave):
        for n in round_order(list(cases), i):
            model, optim, x = cases[n]
            times[n].append(_median_step(model, optim, x, mode, args.device, args.iters,
                                         args.amp))
    return times


def format_table(rows: list[dict]) -> str:
    """Rows as a text table; ``peak MiB`` is the growth during the steps, ``total MiB`` (CUDA
    only) the whole peak allocation including the model and input."""
    paired = any('speed_ratio_rounds' in r for r in rows)
    head = (f'{"arch":<13}{"res":>6}{"batch":>6}{"mode":>9}{"params(M)":>11}{"img/s":>10}'
            f'{"peak MiB":>11}{"total MiB":>11}{"ref":>10}{"speed/ref":>11}{"mem/ref":>9}'
            + (f'{"95% CI":>12}{"rounds":>13}{"processes":>11}' if paired else ''))
    lines = [head, '-' * len(head)]
    for r in rows:
        line = (f'{r["arch"]:<13}{r["res"]:>6}{r["batch"]:>6}{r["mode"]:>9}'
                f'{r["params"]:>11.2f}{r["imgs"]:>10.2f}{r["mem"]:>11.1f}'
                f'{r.get("mem_total", float("nan")):>11.1f}{r["ref"]:>10}'
                f'{r["speed_ratio"]:>11.2f}{r["mem_ratio"]:>9.2f}')
        if paired:
            rounds = r.get('speed_ratio_rounds') or [float('nan')]
            line += (f'{interval_text(r.get("speed_ratio_ci"), 2):>12}'
                     f'{interval_text((min(rounds), max(rounds)), 2):>13}'
                     f'{r.get("speed_ratio_processes", float("nan")):>11.2f}')
        lines.append(line)
    if paired:
        lines.append('speed/ref: the median of the interleaved rounds\' ratios (95% CI: its '
                     'distribution-free confidence interval, - below 6 rounds; rounds: their '
                     'range; processes: the ratio of the separate processes\' best img/s)')
    return '\n'.join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--archs', nargs='+', default=list(DEFAULT_ARCHS), choices=list(ARCHS))
    parser.add_argument('--res', nargs='+', type=int, default=[224, 512, 1024])
    parser.add_argument('--modes', nargs='+', default=list(MODES), choices=MODES)
    parser.add_argument('--batch', type=int, nargs='+', default=[8],
                        help='batch size, or one per --res value (e.g. --res 224 512 1024 '
                        '--batch 64 16 4)')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--iters', type=int, default=10)
    parser.add_argument('--rounds', type=int, default=1,
                        help='measure the models this many times, alternating, and keep each '
                        "one's best img/s (and its highest peak memory) for the ratios")
    parser.add_argument('--interleave', type=int, default=0, metavar='R',
                        help='also run the models of each case in one process, each in turn '
                        '--iters steps (the order reversed every other round), R rounds, and '
                        "take the speed ratio as the median of the rounds' ratios (trustworthy "
                        'on a shared machine whose speed drifts between processes), with its '
                        '95%% confidence interval from 6 rounds on; '
                        'peak memory stays that of the separate processes')
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--amp', action='store_true', help='bfloat16 autocast')
    parser.add_argument('--compile', action='store_true', help='torch.compile each model')
    parser.add_argument('--recompute-merge', action='store_true',
                        help='DinoVim/MambaReg on CUDA: recompute the merged output in the '
                        'backward pass (BiSSD(recompute_merge=True); less memory)')
    parser.add_argument('--chunk-size', type=int,
                        help='DinoVim/MambaReg: SSD chunk size of the Triton scan (default 256, as '
                        'the official models; the result changes only by rounding)')
    parser.add_argument('--keep-freed-memory', action='store_true',
                        help='CPU: let glibc keep freed blocks for reuse (mmdinomamba.utils.'
                        'cpu_memory.keep_freed_cpu_memory) in every measured process')
    parser.add_argument('--with-cp', action='store_true',
                        help='activation checkpointing per block (memory for speed)')
    parser.add_argument('--ref', choices=list(ARCHS),
                        help='compare every model with this one (e.g. vit-b); default: the ViT '
                        'of its size (t and s -> vit-s, b -> vit-b)')
    parser.add_argument('--json', help='also write the rows to this JSON file')
    parser.add_argument('--profile', nargs=3, metavar=('ARCH', 'RES', 'MODE'),
                        help='instead of the table: profile one case (torch.profiler) and print '
                        'the most expensive operators, e.g. --profile dinovim-b 224 train')
    parser.add_argument('--trace', help='with --profile: also write a Chrome trace here')
    parser.add_argument('--breakdown', nargs=3, metavar=('ARCH', 'RES', 'MODE'),
                        help="instead of the table: time the pieces of BiSSD's CPU kernels "
                        'inside whole steps of one case, e.g. --breakdown dinovim-t 224 fwd+bwd')
    parser.add_argument('--one', nargs=3, metavar=('ARCH', 'RES', 'MODE'), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.rounds < 1:
        sys.exit(f'--rounds must be >= 1, got {args.rounds}')
    if args.interleave < 0:
        sys.exit(f'--interleave must be >= 0, got {args.interleave}')
    # in this process: the one case measured, or the interleaved rounds
    if args.keep_freed_memory and (args.one or args.profile or args.breakdown
                                   or args.interleave):
        from mmdinomamba.utils.cpu_memory import keep_freed_cpu_memory
        keep_freed_cpu_memory()
    if args.profile:
        print(profile(args))
        return
    if args.breakdown:
        print(breakdown(args))
        return
    if args.one:
        name, res, mode = args.one
        print(json.dumps(measure(name, int(res), mode, args.batch[0], args.device, args.iters,
                                 args.warmup, args.amp, args.compile, build_options(args))))
        return
    rows = run(args)
    print(f'device={args.device} batch={args.batch} iters={args.iters} rounds={args.rounds} '
          f'interleave={args.interleave} amp={args.amp} '
          f'compile={args.compile} '
          f'recompute_merge={args.recompute_merge} '
          f'with_cp={args.with_cp} keep_freed_memory={args.keep_freed_memory} '
          f'chunk_size={args.chunk_size or "default"} '
          f'threads={torch.get_num_threads()}')
    print(format_table(rows))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(rows, f, indent=1)


if __name__ == '__main__':
    main()
