"""GPU check of the SSD scan and the BiSSD mixer: Triton vs portable equivalence, and timings.

Usage (on a machine with CUDA and ``mamba_ssm`` installed, see ``tools/gpu/README.md``)::

    python tools/gpu/gpu_check.py [--quick]

Prints, for the scan in bf16, the relative error against a float64 scan of (a) the Triton
kernel and (b) plain PyTorch in bf16 (the portable chunked scan with ``upcast=False``), for the
output and every gradient, with the ratio (a)/(b) (acceptance: <= ~2); then the same mixer run
through the CUDA path and the portable path (float32 and bf16 autocast); then timings
(forward + backward, CUDA events) of the scan and of one BiSSD layer (one scan call for both
directions vs two, fused conv / merge kernels vs separate ops, conv recomputed or kept, with
peak memory). Exits with status 0 and a note when CUDA is not available, 1 when a check fails.
"""
import argparse
import contextlib
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def scan_inputs(batch, length, heads, groups=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, heads, 64, generator=gen)
    dt = F.softplus(torch.randn(batch, length, heads, generator=gen) - 3)
    A = -torch.empty(heads).uniform_(1, 16, generator=gen)
    B, C = (torch.randn(batch, length, groups, 64, generator=gen) for _ in range(2))
    D = torch.randn(heads, generator=gen)
    return [t.cuda() for t in (x, dt, A, B, C, D)]


def check_scan(batch, length, heads):
    """Triton vs plain bf16 PyTorch, both against float64. Returns True if within 2x (+1e-3)."""
    from mmdinomamba.ops import ssd_scan, ssd_scan_chunked
    base = scan_inputs(batch, length, heads)
    exact = [t.double().requires_grad_() for t in base]
    tri = [(t.float() if i in (2, 5) else t.bfloat16()).requires_grad_()
           for i, t in enumerate(base)]
    plain = [t.detach().clone().requires_grad_() for t in tri]
    dy = torch.randn_like(base[0])
    ssd_scan_chunked(*exact).backward(dy.double())
    ssd_scan(*tri, chunk_size=256, backend='triton').float().backward(dy)
    ssd_scan_chunked(*plain, upcast=False).float().backward(dy)
    y64 = ssd_scan_chunked(*[t.detach() for t in exact])
    y_tri = ssd_scan(*[t.detach() for t in tri], chunk_size=256, backend='triton')
    y_pt = ssd_scan_chunked(*[t.detach() for t in plain], upcast=False)
    ok = True
    print(f'scan bf16, B={batch} L={length} h={heads}: rel. error vs float64')
    rows = [('y', y_tri, y_pt, y64)
            ] + [(n, a.grad, p.grad, e.grad)
                 for n, a, p, e in zip(['dx', 'ddt', 'dA', 'dB', 'dC', 'dD'], tri, plain, exact)]
    for name, a, p, e in rows:
        ea, ep = rel(a, e), rel(p, e)
        ok &= ea <= 2 * ep + 1e-3
        print(f'  {name:<4} triton {ea:.2e}  torch-bf16 {ep:.2e}  ratio {ea / max(ep, 1e-30):.2f}')
    return ok


def check_mixer(dims=192, length=197, batch=8):
    """CUDA path (Triton scan + fused kernels if installed) vs the portable path."""
    from mmdinomamba.models.mixers import BiSSD
    torch.manual_seed(0)
    m = BiSSD(dims).cuda()
    x = torch.randn(batch, length, dims, device='cuda')
    ok = True
    for amp in (False, True):
        outs = []
        for backend in ('auto', 'torch'):
            m.backend = backend
            m.zero_grad()
            with torch.autocast('cuda', dtype=torch.bfloat16, enabled=amp):
                y = m(x)
            y.float().square().mean().backward()
            outs.append((y.float(), {n: p.grad.clone() for n, p in m.named_parameters()}))
        err_y = rel(outs[0][0], outs[1][0])
        err_g = max(rel(outs[0][1][n], outs[1][1][n]) for n in outs[0][1])
        tol = 3e-2 if amp else 1e-2  # fp32 Triton matmuls may use TF32
        ok &= err_y < tol and err_g < 3 * tol
        print(f'mixer d={dims} L={length} {"bf16 autocast" if amp else "float32"}: '
              f'rel. diff auto vs portable: output {err_y:.2e}, worst grad {err_g:.2e}')
    return ok


def timeit(fn, repeats=20):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def timings(quick):
    from mmdinomamba.models.mixers import BiSSD
    from mmdinomamba.ops import reference_ops, ssd_scan
    cases = [(64, 197, 48), (4, 4097, 48)] if not quick else [(8, 197, 16)]
    for batch, length, heads in cases:
        args = [
            t.bfloat16() if i not in (2, 5) else t
            for i, t in enumerate(scan_inputs(batch, length, heads))
        ]
        args = [a.requires_grad_() for a in args]
        # the chunk size changes only rounding, not the result: which one is fastest here?
        for backend, chunk in (('triton', 64), ('triton', 128), ('triton', 256), ('torch', 64)):
            ms = timeit(lambda: ssd_scan(*args, chunk_size=chunk, backend=backend).float().sum()
                        .backward())
            print(f'scan fwd+bwd B={batch} L={length} h={heads} {backend:<6} chunk {chunk:>3}: '
                  f'{ms:8.2f} ms')
    m = BiSSD(768).cuda()
    x = torch.randn(64 if not quick else 8, 197, 768, device='cuda', requires_grad=True)
    for recompute_merge in (False, True):  # the default path; the merge recomputed
        m.recompute_merge = recompute_merge

        def step():
            with torch.autocast('cuda', dtype=torch.bfloat16):
                m(x).float().sum().backward()

        for name, mode in (('kernels', contextlib.nullcontext), ('reference', reference_ops)):
            with mode():
                ms = timeit(step)
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                step()
                peak = (torch.cuda.max_memory_allocated() - base) / 2**20
            print(f'BiSSD-B layer fwd+bwd B={x.shape[0]} L=197 {name} '
                  f'recompute_merge={recompute_merge}: {ms:8.2f} ms, peak {peak:7.1f} MiB')
    m.recompute_merge = False
    for chunk in (64, 128, 256):
        m.chunk_size = chunk

        def step():
            with torch.autocast('cuda', dtype=torch.bfloat16):
                m(x).float().sum().backward()

        print(f'BiSSD-B layer fwd+bwd B={x.shape[0]} L=197 default path, chunk {chunk}: '
              f'{timeit(step):8.2f} ms')


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--quick', action='store_true', help='small sizes only')
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print('gpu_check: CUDA is not available; nothing to check.')
        return 0
    from mmdinomamba.ops.cuda._triton import chunk_scan_fn
    if chunk_scan_fn() is None:
        print('gpu_check: mamba_ssm Triton kernels not importable; only the portable path runs.')
        return 0
    ok = check_scan(2, 1024 if not args.quick else 300, 8)
    ok &= check_mixer()
    timings(args.quick)
    print('gpu_check:', 'PASS' if ok else 'FAIL')
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
