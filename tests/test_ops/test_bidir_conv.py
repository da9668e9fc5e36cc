"""Both directions' causal convs in one call: the portable spec, the Triton kernel (through
Triton's CPU interpreter) and the CUDA dispatch."""
import textwrap

import pytest
import torch

from mmdinomamba.ops import bidir_causal_conv1d, causal_conv1d, reference_ops
from mmdinomamba.ops.reference.conv import bidir_causal_conv1d_ref as bidir_causal_conv1d_portable


def _direct(x, weight, bias, splits, activation):
    """Each direction and segment separately, then placed by explicit channel offsets."""
    B, L, C = x.shape
    out = torch.empty(B, L, 2 * C, dtype=x.dtype)
    lo = 0
    for size in splits:
        seg = slice(lo, lo + size)
        for d, src in enumerate((x, x.flip(1))):
            b = None if bias is None else bias[d, seg]
            y = causal_conv1d(src[..., seg], weight[d, seg], b, activation=activation)
            out[..., 2 * lo + d * size:2 * lo + (d + 1) * size] = y
        lo += size
    return out


@pytest.mark.parametrize('splits,with_bias,activation', [((12, ), True, 'silu'),
                                                         ((8, 2, 2), True, 'silu'),
                                                         ((6, 6), False, None)])
def test_portable_matches_direct(splits, with_bias, activation):
    x = torch.randn(2, 9, 12)
    w, b = torch.randn(2, 12, 4), torch.randn(2, 12) if with_bias else None
    torch.testing.assert_close(
        bidir_causal_conv1d(x, w, b, splits, activation), _direct(x, w, b, splits, activation))


def test_backward_part_is_anticausal_in_original_order():
    x = torch.randn(1, 10, 4)
    w, b = torch.randn(2, 4, 3), torch.randn(2, 4)
    y = bidir_causal_conv1d(x, w, b, (4, ), None)
    x2 = x.clone()
    x2[:, 6] += 1.
    y2 = bidir_causal_conv1d(x2, w, b, (4, ), None)
    fwd_changed = (y[..., :4] != y2[..., :4]).any(-1)[0]
    bwd_changed = (y[..., 4:] != y2[..., 4:]).any(-1)[0].flip(0)  # back to token order
    assert not fwd_changed[:6].any() and fwd_changed[6:9].all()
    assert not bwd_changed[7:].any() and bwd_changed[4:7].all()


def test_clear_errors():
    x = torch.randn(1, 5, 6)
    with pytest.raises(ValueError, match='splits'):
        bidir_causal_conv1d(x, torch.randn(2, 6, 4), None, (4, 4))
    with pytest.raises(ValueError, match=r'weight \(2, C, K\)'):
        bidir_causal_conv1d(x, torch.randn(6, 4), None, (6, ))
    with pytest.raises(ValueError, match='activation'):
        bidir_causal_conv1d(x, torch.randn(2, 6, 4), None, (6, ), activation='relu')


_INTERPRETED = textwrap.dedent('''
    import torch
    from mmdinomamba.ops.cuda import bidir_conv_triton as T
    from mmdinomamba.ops.reference.conv import bidir_causal_conv1d_ref as spec
    T.self_check(device='cpu')
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        T.self_check(device='cpu')  # as on a first call from a no-grad, autocast forward
    with torch.inference_mode():
        T.self_check(device='cpu')
    torch.manual_seed(0)
    worst = 0.
    for B, L, C, splits, act, bias in [(1, 1, 8, (8, ), True, True),
                                       (2, 70, 100, (64, 18, 18), True, True),
                                       (1, 33, 20, (10, 10), False, False)]:
        x = torch.randn(B, L, C + 5)[..., 2:2 + C]  # a strided view, as a projection split
        w, b = torch.randn(2, C, 4), torch.randn(2, C) if bias else None
        go = torch.randn(B, L, 2 * C)
        res = []
        for fused in (True, False):
            leaves = [t.clone().requires_grad_() for t in (x, w, b) if t is not None]
            args = leaves if bias else leaves + [None]
            y = (T.bidir_causal_conv(*args, splits, act) if fused
                 else spec(*args, splits, 'silu' if act else None))
            res.append([y, *torch.autograd.grad(y, leaves, go)])
        for a, r in zip(*res):
            worst = max(worst, ((a - r).norm() / r.norm()).item())
    print('WORST', worst)
''')


def test_triton_kernel_matches_spec_in_interpreter(run_interpreted):
    worst = float(run_interpreted(_INTERPRETED).split('WORST')[-1])
    assert worst < 1e-5, worst


def test_cpu_tensors_never_reach_the_kernel(monkeypatch):
    from mmdinomamba.ops.cuda import _triton

    def boom():
        raise AssertionError('kernel looked up for CPU tensors')

    monkeypatch.setattr(_triton, 'bidir_conv_fn', boom)
    x, w = torch.randn(1, 5, 6), torch.randn(2, 6, 4)
    torch.testing.assert_close(bidir_causal_conv1d(x, w, None, (6, )),
                               bidir_causal_conv1d_portable(x, w, None, (6, )))


@pytest.mark.gpu
def test_cuda_fused_matches_portable():
    x = torch.randn(2, 197, 1200, device='cuda')[..., 16:1168]  # strided, as a split
    w, b = torch.randn(2, 1152, 4, device='cuda'), torch.randn(2, 1152, device='cuda')
    go = torch.randn(2, 197, 2304, device='cuda')
    res = []
    for portable in (False, True):
        leaves = [t.clone().requires_grad_() for t in (x, w, b)]
        if portable:
            with reference_ops():
                y = bidir_causal_conv1d(*leaves, (1024, 64, 64))
        else:
            y = bidir_causal_conv1d(*leaves, (1024, 64, 64))
        res.append([y, *torch.autograd.grad(y, leaves, go)])
    for a, r in zip(*res):
        assert ((a - r).norm() / r.norm()).item() < 1e-4


def test_a_kernel_that_fails_at_run_time_raises(kernels_as_on_cuda):
    """Dispatch as on CUDA (a fake CUDA check) with a kernel that raises: the error reaches the
    caller (no silent fallback) and the kernel stays in use."""
    from mmdinomamba.ops.cuda import _triton
    calls = []

    def broken(*args):
        calls.append(1)
        raise RuntimeError('no such GPU')

    kernels_as_on_cuda(bidir_conv=broken)
    x, w = torch.randn(1, 5, 6), torch.randn(2, 6, 4)
    for _ in range(2):
        with pytest.raises(RuntimeError, match='no such GPU'):
            bidir_causal_conv1d(x, w, None, (6, ))
    assert calls == [1, 1] and _triton._cache['bidir_conv'] is broken
