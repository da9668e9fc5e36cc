"""Benchmark the portable SSD scan against a straightforward ``ssd_minimal``-style reference.

Usage::

    OMP_NUM_THREADS=1 python tools/analysis/benchmark_ssd.py    # CPU (+ CUDA if present)
    python tools/analysis/benchmark_ssd.py --devices cuda --lengths 4096     # Triton too

Every (implementation, length, mode) case runs in a FRESH subprocess, so the peak memory of one
case cannot hide in another's allocations. Peak memory: on CPU, the growth of the process's
peak resident set size (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) over the first call,
measured after the inputs (and the output gradient) are allocated; on CUDA,
``torch.cuda.max_memory_allocated()`` minus the memory allocated before the call. Time: the best
of ``--repeats`` calls after that first call (wall clock; CUDA synchronized).

Implementations:

* ``portable``: ``mmdinomamba.ops.ssd_scan(..., backend='torch')`` (chunks of 32; on CPU
  the native kernels with their hand-written backward where they are built, else the PyTorch
  reference with autograd: set ``MMDINOMAMBA_KERNELS=0`` to time that);
* ``minimal-<block>``: the 4-step segsum algorithm of mamba_ssm's ``ssd_minimal.py``
  (re-written here): per-head B/C, L padded to a multiple of the block, 5-D einsums and a
  (chunks+1)^2 segsum for the state passing; autograd for the backward;
* ``triton`` (CUDA only): ``mamba_chunk_scan_combined`` when mamba_ssm imports;

Inputs: batch 1, ``--heads`` heads of 64 channels, state 64, one group; ``dt = softplus(N(-2, 1))``
(median 0.13), ``A = -U(1, 16)`` (the Mamba-2 init range), so decays span gentle to strong.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch
import torch.nn.functional as F


def _segsum(a):
    """``out[..., i, j] = a[j+1] + ... + a[i]`` for ``i >= j``, ``-inf`` above the diagonal."""
    T = a.shape[-1]
    a = a[..., None].expand(*a.shape, T).clone()  # a[..., i, j] = a_i
    lower = torch.ones(T, T, dtype=torch.bool, device=a.device)
    a = a.masked_fill(~lower.tril(-1), 0)
    return torch.cumsum(a, dim=-2).masked_fill(~lower.tril(), -torch.inf)


def ssd_minimal_style(x, dt, A, B, C, D=None, block=256):
    """The ssd_minimal chunked algorithm: x (b, L, h, p), B/C (b, L, g, n); pads L to ``block``."""
    b, length, h, p = x.shape
    Bh = B.repeat_interleave(h // B.shape[2], dim=2)
    Ch = C.repeat_interleave(h // C.shape[2], dim=2)
    X, Aa, pad = x * dt[..., None], dt * A, (-length) % block
    if pad:
        X, Bh, Ch = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (X, Bh, Ch))
        Aa = F.pad(Aa, (0, 0, 0, pad))
    c = (length + pad) // block
    X, Bh, Ch = (t.reshape(b, c, block, *t.shape[2:]) for t in (X, Bh, Ch))
    Aa = Aa.reshape(b, c, block, h).permute(0, 3, 1, 2)  # (b, h, c, l)
    A_cum = torch.cumsum(Aa, dim=-1)
    # 1. intra-chunk outputs
    y_diag = torch.einsum('bclhn,bcshn,bhcls,bcshp->bclhp', Ch, Bh, torch.exp(_segsum(Aa)), X)
    # 2. chunk states
    decay = torch.exp(A_cum[..., -1:] - A_cum)
    states = torch.einsum('bclhn,bhcl,bclhp->bchpn', Bh, decay, X)
    # 3. inter-chunk recurrence
    states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)
    decay_chunk = torch.exp(_segsum(F.pad(A_cum[..., -1], (1, 0))))
    states = torch.einsum('bhzc,bchpn->bzhpn', decay_chunk, states)[:, :-1]
    # 4. state -> output
    y_off = torch.einsum('bclhn,bchpn,bhcl->bclhp', Ch, states, torch.exp(A_cum))
    y = (y_diag + y_off).reshape(b, c * block, h, p)[:, :length]
    return y if D is None else y + x * D[:, None]


def _inputs(length, heads, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, length, heads, 64, generator=gen)
    dt = F.softplus(torch.randn(1, length, heads, generator=gen) - 2)
    A = -torch.empty(heads).uniform_(1, 16, generator=gen)
    B, C = (torch.randn(1, length, 1, 64, generator=gen) for _ in range(2))
    D = torch.randn(heads, generator=gen)
    return [t.to(device) for t in (x, dt, A, B, C, D)]


def _impl(name):
    if name in ('portable', 'triton'):
        from mmdinomamba.ops import ssd_scan
        backend = 'torch' if name == 'portable' else 'triton'
        return lambda *a: ssd_scan(*a, chunk_size=256, backend=backend)
    block = int(name.split('-')[1])
    return lambda *a: ssd_minimal_style(*a, block=block)


def worker(case):
    """Run one case in this process; print one JSON line."""
    return _measure(case)


def _measure(case):
    torch.set_num_threads(case['threads'])
    if case.get('keep_freed_memory'):
        from mmdinomamba.utils.cpu_memory import keep_freed_cpu_memory
        keep_freed_cpu_memory()
    device, cuda = case['device'], case['device'] == 'cuda'
    fn, args = _impl(case['impl']), _inputs(case['length'], case['heads'], device)
    backward = case['mode'] == 'fwd+bwd'
    if backward:
        args = [a.requires_grad_() for a in args]
    dy = torch.randn_like(args[0])

    def call():
        if backward:
            fn(*args).backward(dy)
            for a in args:
                a.grad = None
        else:
            with torch.no_grad():
                fn(*args)
        if cuda:
            torch.cuda.synchronize()

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    call()
    if cuda:
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_rss) / 1024
    times = []
    for _ in range(case['repeats']):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    print(json.dumps(dict(case, ms=1e3 * min(times), peak_mb=peak)))


def run_case(case):
    env = dict(os.environ, OMP_NUM_THREADS=str(case['threads']))
    out = subprocess.run([sys.executable, __file__, '--worker',
                          json.dumps(case)],
                         capture_output=True,
                         text=True,
                         env=env)
    if out.returncode != 0:
        raise RuntimeError(f'case {case} failed:\n{out.stderr[-2000:]}')
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--lengths', type=int, nargs='+', default=[1024, 4096])
    parser.add_argument('--heads', type=int, default=24)
    parser.add_argument('--ref-blocks', type=int, nargs='+', default=[256, 64])
    parser.add_argument(
        '--devices',
        nargs='+',
        choices=['cpu', 'cuda'],
        help='default: cpu, plus cuda when available')
    parser.add_argument('--threads', type=int, default=int(os.environ.get('OMP_NUM_THREADS', 1)))
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--keep-freed-memory', action='store_true',
                        help='CPU: let glibc keep freed blocks for reuse in every measured process '
                        '(mmdinomamba.utils.cpu_memory.keep_freed_cpu_memory, as tools/train.py '
                        'does on CPU)')
    parser.add_argument('--worker', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    devices = args.devices or ['cpu'] + (['cuda'] if torch.cuda.is_available() else [])
    if 'cuda' in devices and not torch.cuda.is_available():
        sys.exit('--devices cuda: CUDA is not available')
    for device in devices:
        report(device, args)
    print('x faster / x memory: time and peak of each row divided by those of `portable` '
          '(> 1 means portable is faster / leaner).')


def report(device, args):
    """Run and print all cases of one device."""
    impls = ['portable'] + [f'minimal-{b}' for b in args.ref_blocks]
    impls += ['triton'] if device == 'cuda' else []
    print(f'\nSSD scan, batch 1, {args.heads} heads x 64, state 64, device {device}, '
          f'threads {args.threads}, keep freed memory {args.keep_freed_memory}; peak = ' +
          ('CUDA max_memory_allocated growth' if device == 'cuda' else 'ru_maxrss growth'))
    print(f'{"impl":<14} {"L":>5} {"mode":<8} {"time ms":>9} {"peak MB":>9} '
          f'{"x faster":>9} {"x memory":>9}')
    for length in args.lengths:
        for mode in ('fwd', 'fwd+bwd'):
            rows = [
                run_case(
                    dict(
                        impl=i,
                        length=length,
                        mode=mode,
                        heads=args.heads,
                        device=device,
                        threads=args.threads,
                        repeats=args.repeats,
                        keep_freed_memory=args.keep_freed_memory)) for i in impls
            ]
            ours = rows[0]
            for r in rows:
                print(f'{r["impl"]:<14} {length:>5} {mode:<8} {r["ms"]:>9.1f} '
                      f'{r["peak_mb"]:>9.1f} {r["ms"] / ours["ms"]:>9.2f} '
                      f'{r["peak_mb"] / max(ours["peak_mb"], 1e-9):>9.2f}')


if __name__ == '__main__':
    main()
