"""The CUDA mixer's ops ``mmdinomamba::bidir_conv_scan`` and ``mmdinomamba::bidir_gated_merge``
(and their backward ops) on CPU tensors under Triton's interpreter: ``torch.library.opcheck``,
the mixer through them against the reference (with the scan's chunk fitted to short sequences
and not), and no graph break in ``torch.compile``."""
import importlib.util
import textwrap

import pytest

from mmdinomamba.ops.cuda._triton import fitted_chunk

_OPCHECK = textwrap.dedent('''
    import torch
    import kernel_interpreter
    kernel_interpreter.route_ops()
    ops = torch.ops.mmdinomamba
    gen = torch.Generator().manual_seed(0)
    B, L, h, p, n = 1, 21, 2, 8, 8  # 2 heads of 8 per direction, one group, d_state 8
    splits = [h * p, n, n]
    C = sum(splits)
    shapes = ((B, L, C), (2, C, 4), (2, C), (B, L, 2 * h), (2 * h, ), (2 * h, ), (2 * h, ))
    ins = [torch.randn(*s, generator=gen) for s in shapes]
    ins[5] = -ins[5].abs() - 0.5  # A < 0
    sizes = (splits, p, n, 16)  # two chunks of 16, the second ragged
    # every check with all arguments, the fake implementations alone without the optional ones;
    # the backward ops are called by autograd only: no autograd or AOT checks of their own
    full = ('test_schema', 'test_autograd_registration', 'test_faketensor',
            'test_aot_dispatch_dynamic')
    fake = ('test_faketensor', )


    def backward_checks(utils):
        return tuple(u for u in utils if u in ('test_schema', 'test_faketensor'))


    for bias, utils in ((True, full), (False, fake)):
        args = [t.clone().requires_grad_() for t in ins]
        args[2] = args[2] if bias else None
        torch.library.opcheck(ops.bidir_conv_scan.default, (*args, *sizes), test_utils=utils)
        out = ops.bidir_conv_scan.default(*args, *sizes)
        plain = [None if t is None else t.detach() for t in args]
        torch.library.opcheck(ops.bidir_conv_scan_backward.default,
                              (torch.randn_like(out), out.detach(), *plain, *sizes),
                              test_utils=backward_checks(utils))
    y = torch.randn(B, L, 2 * h * p + 3, generator=gen)[..., 1:-2]  # strided, as in the mixer
    z = torch.randn(B, L, h * p, generator=gen)
    for weight, utils in ((torch.randn(2, h * p, generator=gen), full), (None, fake)):
        args = [t if t is None else t.clone().requires_grad_() for t in (y, z, weight)]
        torch.library.opcheck(ops.bidir_gated_merge.default, (*args, 1e-5, 8), test_utils=utils)
        out, rstd = ops.bidir_gated_merge.default(*args, 1e-5, 8)
        torch.library.opcheck(ops.bidir_gated_merge_backward.default,
                              (torch.randn_like(out), y, z, weight, rstd, 8),
                              test_utils=backward_checks(utils))
    print('OPCHECK passed')
''')


def test_opcheck_passes_for_the_cuda_ops_in_interpreter(run_interpreted):
    if importlib.util.find_spec('mamba_ssm') is None:
        pytest.skip('needs mamba_ssm (installed by tools/setup_env.sh)')
    assert 'OPCHECK passed' in run_interpreted(_OPCHECK)


_MIXER = textwrap.dedent('''
    import torch
    import kernel_interpreter
    from mmdinomamba.ops import InnerDims, bidir_mixer_ref, bidir_ssd
    from mmdinomamba.ops.cuda import bidir_conv_scan_triton
    kernel_interpreter.route_ops()
    dims = InnerDims(16, 1, 8, 8, 4)  # 2 heads of 8 per direction, d_state 8
    out_proj = torch.nn.Linear(16, 12)
    gen = torch.Generator().manual_seed(0)


    def inputs(length):
        c, h = dims.conv_dim, dims.nheads
        return [torch.randn(2, length, dims.width, generator=gen),
                torch.randn(2, c, 4, generator=gen) / 2, torch.randn(2, c, generator=gen) / 10,
                torch.full((2, h), -2.), -torch.rand(2, h, generator=gen) * 4 - 0.5,
                torch.randn(2, h, generator=gen), 1 + torch.randn(2, 16, generator=gen) / 4]


    def run(fn, args):
        leaves = [a.clone().requires_grad_() for a in args]
        out_proj.zero_grad()
        y = fn(*leaves)
        y.square().sum().backward()
        return [y.detach()] + [t.grad for t in leaves] + [p.grad.clone() for p in
                                                          out_proj.parameters()]


    def worst(a, b):
        return max(((x - r).norm() / r.norm()).item() for x, r in zip(a, b))


    def ref(*a):
        return out_proj(bidir_mixer_ref(*a, dims))


    def ops(chunk, recompute=False):
        return lambda *a: bidir_ssd(*a, dims, out_proj, 'auto', chunk, recompute)


    args = inputs(21)  # two chunks of 16, the second ragged; the merge kept or recomputed
    want = run(ref, args)
    print('OPS', worst(run(ops(16), args), want), worst(run(ops(16, True), args), want))
    expl = torch._dynamo.explain(ops(16))(*args)
    code = ''.join(g.code for g in expl.graphs)
    print('BREAKS', expl.graph_break_count, 'bidir_conv_scan' in code, 'bidir_gated_merge' in code)
    chunks, scan_fwd = [], bidir_conv_scan_triton._scan_fwd
    bidir_conv_scan_triton._scan_fwd = lambda *a, **k: chunks.append(a[5]) or scan_fwd(*a, **k)
    args = inputs(37)  # one chunk: fitted (64) or as given (256)
    want, fitted = run(ref, args), run(ops(256), args)
    bidir_conv_scan_triton.fitted_chunk = lambda seqlen, chunk_size: chunk_size
    padded = run(ops(256), args)
    print('CHUNKS', chunks, worst(fitted, want), worst(padded, want), worst(fitted, padded))
''')


def test_mixer_through_the_cuda_ops_matches_reference_in_interpreter(run_interpreted):
    """``bidir_ssd`` in the CUDA room (both ops; Triton's interpreter) equals the reference,
    output and every gradient, with the merge kept or recomputed, and traces into one graph
    holding both ops; a sequence shorter than one chunk gives the same result in the fitted
    chunk (64) and the chunk as given (256)."""
    if importlib.util.find_spec('mamba_ssm') is None:
        pytest.skip('needs mamba_ssm (installed by tools/setup_env.sh)')
    out = run_interpreted(_MIXER)
    kept, recomputed = map(float, out.split('OPS')[-1].split()[:2])
    assert kept < 1e-5 and recomputed < 1e-5, out
    assert 'BREAKS 0 True True' in out, out
    chunks = out.split('CHUNKS')[-1]
    assert chunks.startswith(' [64, 256] '), out  # the chunk each forward pass scanned in
    fitted, padded, between = map(float, chunks.split(']')[-1].split())
    assert fitted < 1e-5 and padded < 1e-5 and between < 1e-5, out


@pytest.mark.parametrize('seqlen,chunk,fitted', [(37, 256, 64), (197, 256, 256), (5, 256, 16),
                                                 (300, 256, 256), (64, 64, 64), (65, 64, 64)])
def test_fitted_chunk(seqlen, chunk, fitted):
    assert fitted_chunk(seqlen, chunk) == fitted
