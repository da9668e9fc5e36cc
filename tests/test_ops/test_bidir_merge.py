"""Output side of the bidirectional mixer in one call: the portable spec against an explicit
float64 formula, the Triton kernel (through Triton's CPU interpreter) against the spec, and the
CUDA dispatch."""
import textwrap

import pytest
import torch

from mmdinomamba.ops import bidir_gated_merge, reference_ops
from mmdinomamba.ops.reference.norm import bidir_gated_merge_ref as bidir_gated_merge_portable


def _explicit(y, z, weight, eps, group_size):
    """Token by token, direction by direction, group by group, in float64."""
    y, z = y.double(), z.double()
    B, L, d = z.shape
    out = torch.zeros(B, L, d, dtype=torch.float64)
    for b in range(B):
        for t in range(L):
            gate = z[b, t] * torch.sigmoid(z[b, t])
            for direction, src in ((0, y[b, t, :d]), (1, y[b, L - 1 - t, d:])):
                h = src * gate
                if weight is None:
                    out[b, t] += h / 2
                    continue
                for lo in range(0, d, group_size):
                    g = slice(lo, lo + group_size)
                    rms = torch.sqrt((h[g]**2).mean() + eps)
                    out[b, t, g] += h[g] / rms * weight[direction, g].double() / 2
    return out


@pytest.mark.parametrize('group_size,with_norm', [(12, True), (4, True), (12, False)])
def test_portable_matches_explicit(group_size, with_norm):
    y, z = torch.randn(2, 5, 24), torch.randn(2, 5, 12)
    w = torch.randn(2, 12) if with_norm else None
    got = bidir_gated_merge(y, z, w, 1e-5, group_size)
    torch.testing.assert_close(got.double(), _explicit(y, z, w, 1e-5, group_size), rtol=1e-5,
                               atol=1e-5)


def test_clear_errors():
    y, z = torch.randn(1, 4, 16), torch.randn(1, 4, 8)
    with pytest.raises(ValueError, match=r'y \(B, L, 2d\)'):
        bidir_gated_merge(y[..., :15], z, None)
    with pytest.raises(ValueError, match=r'weight \(2, d\)'):
        bidir_gated_merge(y, z, torch.ones(8))
    with pytest.raises(ValueError, match='group_size 3 must divide d=8'):
        bidir_gated_merge(y, z, torch.ones(2, 8), group_size=3)


_INTERPRETED = textwrap.dedent('''
    import torch
    from mmdinomamba.ops.cuda import bidir_merge_triton as T
    from mmdinomamba.ops.reference.norm import bidir_gated_merge_ref as spec
    T.self_check(device='cpu')
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        T.self_check(device='cpu')  # as on a first call from a no-grad, autocast forward
    torch.manual_seed(0)
    worst = {}
    for B, L, d, gs, norm, dtype in [(1, 1, 8, 8, True, torch.float32),
                                     (2, 13, 96, 48, True, torch.float32),
                                     (3, 9, 40, 40, False, torch.float32),
                                     (2, 17, 64, 64, True, torch.bfloat16)]:
        y = torch.randn(B, L, 2 * d + 6)[..., 3:3 + 2 * d].to(dtype)  # strided views
        z = torch.randn(B, L, d + 5)[..., 1:1 + d].to(dtype)
        w = torch.randn(2, d) if norm else None
        go = torch.randn(B, L, d).to(dtype)
        res = []
        for fn in (T.bidir_gated_merge, spec):
            leaves = [t.clone().requires_grad_() for t in (y, z, w) if t is not None]
            out = fn(*(leaves if norm else leaves + [None]), 1e-5, gs)
            res.append([out, *torch.autograd.grad(out, leaves, go)])
        assert res[0][0].dtype == dtype and res[0][1].dtype == dtype
        for a, r in zip(*res):
            err = ((a.double() - r.double()).norm() / r.double().norm()).item()
            worst[str(dtype)] = max(worst.get(str(dtype), 0.), err)
    print('WORST', worst['torch.float32'], worst['torch.bfloat16'])
''')


def test_triton_kernel_matches_spec_in_interpreter(run_interpreted):
    f32, bf16 = map(float, run_interpreted(_INTERPRETED).split('WORST')[-1].split())
    assert f32 < 1e-5, f32
    assert bf16 < 2e-2, bf16  # bf16 rounding of inputs, outputs and the spec's intermediates


def test_cpu_tensors_never_reach_the_kernel(monkeypatch):
    from mmdinomamba.ops.cuda import _triton

    def boom():
        raise AssertionError('kernel looked up for CPU tensors')

    monkeypatch.setattr(_triton, 'bidir_merge_fn', boom)
    y, z, w = torch.randn(1, 5, 12), torch.randn(1, 5, 6), torch.randn(2, 6)
    torch.testing.assert_close(bidir_gated_merge(y, z, w), bidir_gated_merge_portable(y, z, w))


def test_a_kernel_that_fails_at_run_time_raises(kernels_as_on_cuda):
    """Dispatch as on CUDA (a fake CUDA check) with a kernel that raises: the error reaches the
    caller (no silent fallback) and the kernel stays in use."""
    from mmdinomamba.ops.cuda import _triton
    calls = []

    def broken(*args):
        calls.append(1)
        raise RuntimeError('no such GPU')

    kernels_as_on_cuda(bidir_merge=broken)
    y, z, w = torch.randn(1, 5, 12), torch.randn(1, 5, 6), torch.randn(2, 6)
    for _ in range(2):
        with pytest.raises(RuntimeError, match='no such GPU'):
            bidir_gated_merge(y, z, w)
    assert calls == [1, 1] and _triton._cache['bidir_merge'] is broken


@pytest.mark.gpu
@pytest.mark.parametrize('with_norm', [True, False])
def test_cuda_fused_matches_portable(with_norm):
    """BiSSD-B sizes (d_inner 1536, one group), strided views as the mixer passes them."""
    y = torch.randn(2, 197, 3200, device='cuda')[..., 64:3136]
    z = torch.randn(2, 197, 1600, device='cuda')[..., 32:1568]
    w = torch.randn(2, 1536, device='cuda') if with_norm else None
    go = torch.randn(2, 197, 1536, device='cuda')
    res = []
    for portable in (False, True):
        leaves = [t.clone().requires_grad_() for t in (y, z, w) if t is not None]
        args = leaves if with_norm else leaves + [None]
        if portable:
            with reference_ops():
                out = bidir_gated_merge(*args)
        else:
            out = bidir_gated_merge(*args)
        res.append([out, *torch.autograd.grad(out, leaves, go)])
    for a, r in zip(*res):
        assert ((a - r).norm() / r.norm()).item() < 1e-4
