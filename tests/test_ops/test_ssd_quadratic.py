"""The quadratic SSD form (factored per group, per head for strong decay) == the sequential
recurrence, outputs and gradients, in float32 and float64."""
from unittest.mock import patch

import pytest
import torch

from mmdinomamba.ops import ssd_scan, ssd_scan_ref
from mmdinomamba.ops.cpu.ssd_quadratic import (FACTORED_RANGE, block_bounds, scan_backward,
                                                scan_forward)

from test_ssd_scan import (HEADS, HEADDIM, assert_float32_close_to_float64, assert_float64_exact,
                           make_inputs, rel_err)


def _channel_major(x, dt, A, B, C, D):
    return (x.permute(0, 2, 3, 1), dt.transpose(1, 2), A, B.permute(0, 2, 3, 1),
            C.permute(0, 2, 3, 1), D)


def _one_direction(*args):
    """``ssd_scan``'s operands as one causal direction (R = 1) of :func:`scan_forward`'s
    layout."""
    return [None if t is None else t.unsqueeze(1 if t.dim() > 1 else 0).contiguous()
            for t in _channel_major(*args)]


def _tokens(t):
    """(b, 1, h, p, L) -> (b, L, h, p)."""
    return t.squeeze(1).permute(0, 3, 1, 2)


class _QuadraticSSD(torch.autograd.Function):
    """One causal direction of the quadratic form (scan_forward / scan_backward) on the
    token-major operands of ``ssd_scan``; recomputes its state in the backward pass."""

    @staticmethod
    def forward(ctx, x, dt, A, B, C, D):
        ctx.save_for_backward(x, dt, A, B, C, D)
        return _tokens(scan_forward(*_one_direction(x, dt, A, B, C, D))[0])

    @staticmethod
    def backward(ctx, dy):
        x, dt, A, B, C, D = ctx.saved_tensors
        ins = _one_direction(x, dt, A, B, C, D)
        st = scan_forward(*ins)[1]
        dyc = dy.permute(0, 2, 3, 1).unsqueeze(1).contiguous()
        dx, ddt, dA, dB, dC, dD = scan_backward(dyc, *ins[:5], st, D is not None)
        return (_tokens(dx), ddt.squeeze(1).transpose(1, 2), dA[0], _tokens(dB), _tokens(dC),
                None if dD is None else dD[0])


def ssd_scan_quadratic(x, dt, A, B, C, D=None):
    return _QuadraticSSD.apply(x, dt, A, B, C, D)


def gentle_inputs(length, groups=1, batch=2, seed=0, dtype=torch.float32):
    """Mamba-2 init ranges (dt in [1e-3, 0.1], A in [-16, -1]): every head is factored up to a
    few hundred tokens."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, HEADS, HEADDIM, generator=gen, dtype=dtype)
    dt = torch.exp(torch.empty(batch, length, HEADS, dtype=dtype).uniform_(-6.9, -2.3,
                                                                         generator=gen))
    A = -torch.empty(HEADS, dtype=dtype).uniform_(1, 16, generator=gen)
    B = torch.randn(batch, length, groups, 16, generator=gen, dtype=dtype)
    C = torch.randn(batch, length, groups, 16, generator=gen, dtype=dtype)
    return [x, dt, A, B, C, torch.randn(HEADS, generator=gen, dtype=dtype)]


def _decay_ranges(args):
    dt, A = args[1], args[2]
    return (dt * A).sum(1).abs()  # (batch, heads)


@pytest.mark.parametrize('length', [1, 17, 65, 197, 256])
@pytest.mark.parametrize('groups', [1, 2])
@pytest.mark.parametrize('kind', ['gentle', 'strong'])
def test_float32_matches_float64_recurrence(length, groups, kind):
    args = (gentle_inputs(length, groups, seed=length) if kind == 'gentle' else
            make_inputs(length, groups, seed=length))
    if kind == 'gentle':
        assert (_decay_ranges(args) <= FACTORED_RANGE).all()  # the factored form only
    # the gradient of A sums float32 products over every token pair: 1.1e-5 at 256 tokens
    ins = assert_float32_close_to_float64(ssd_scan_quadratic, args, 2e-5)
    if length == 1:  # y_0 does not depend on A
        assert ins[2].grad.abs().max() == 0


def test_factored_and_per_head_heads_in_one_batch_float64():
    """Half the heads decay too fast to factor: both forms in one call, tight in float64."""
    args = gentle_inputs(90, groups=2, dtype=torch.float64, seed=3)
    args[1][:, :, :2] *= 300.0
    wide = _decay_ranges(args) > FACTORED_RANGE
    assert wide[:, :2].all() and not wide[:, 2:].any()
    assert_float64_exact(ssd_scan_quadratic, args)


@pytest.mark.parametrize('length,bounds', [(33, [0, 33]), (130, [0, 64, 130]),
                                           (197, [0, 64, 128, 197]), (200, [0, 64, 128, 200]),
                                           (320, [0, 80, 160, 240, 320]),
                                           (401, [0, 96, 208, 304, 401])])
def test_triangle_blocks_are_near_equal_with_aligned_inner_bounds(length, bounds):
    assert block_bounds(length) == bounds


def _reference(both, dy):
    """Output and gradients of :func:`scan_forward`'s arguments ``both`` (both directions,
    channel-major) for ``dy``, by the sequential recurrence in float64 and autograd: direction 1
    the scan of the reversed sequence, read back in the original order."""
    leaves = [t.detach().double().requires_grad_() for t in both]
    outs = []
    for r in (0, 1):
        x, dt, A, B, C, D = (leaves[0][:, r].permute(0, 3, 1, 2), leaves[1][:, r].transpose(1, 2),
                             leaves[2][r], leaves[3][:, r].permute(0, 3, 1, 2),
                             leaves[4][:, r].permute(0, 3, 1, 2), leaves[5][r])
        if r == 1:
            x, dt, B, C = x.flip(1), dt.flip(1), B.flip(1), C.flip(1)
        out = ssd_scan_ref(x, dt, A, B, C, D)
        outs.append((out.flip(1) if r == 1 else out).permute(0, 2, 3, 1))
    y = torch.stack(outs, 1)
    return [y.detach(), *torch.autograd.grad(y, leaves, dy.double())]


@pytest.mark.parametrize('scale', [1.0, 300.0])  # factored / per head
@pytest.mark.parametrize('length,groups', [(33, 1), (130, 2), (200, 1)])  # 1, 2, 3 blocks
def test_anti_causal_direction_is_the_flipped_scan(scale, length, groups):
    """Direction 1 of the channel-major layout is the scan of the reversed sequence, read back in
    the original order; both directions in one call (float64), with the triangular products in
    one block or cut into blocks; the hand-written backward against autograd through the
    reference."""
    assert len(block_bounds(length)) - 1 == {33: 1, 130: 2, 200: 3}[length]
    fwd, bwd = gentle_inputs(length, groups, dtype=torch.float64, seed=5), gentle_inputs(
        length, groups, dtype=torch.float64, seed=6)
    bwd[1] = bwd[1] * scale
    both = [torch.stack(pair, 1 if pair[0].dim() > 1 else 0).contiguous()
            for pair in zip(_channel_major(*fwd), _channel_major(*bwd))]
    y, st = scan_forward(*both)
    dy = torch.randn_like(y)
    with torch.no_grad():  # as in an autograd backward pass
        got = [y, *scan_backward(dy, *both[:5], st, True)]
    for a, b in zip(got, _reference(both, dy)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize('dtype,tol', [(torch.float64, 1e-11), (torch.float32, 2e-5)])
@pytest.mark.parametrize('length', [33, 200])  # one and three token blocks
def test_scattered_wide_heads_equal_the_recurrence(dtype, tol, length):
    """Strongly decaying heads, several per direction, some sharing a group matrix, at scattered
    (sample, direction, head) places, next to factored ones: output and every gradient against
    the float64 recurrence."""
    gen = torch.Generator().manual_seed(length)
    b, R, h, p, g, n = 3, 2, 6, 8, 2, 16
    x, dy = (torch.randn(b, R, h, p, length, generator=gen, dtype=dtype) for _ in range(2))
    dt = torch.rand(b, R, h, length, generator=gen, dtype=dtype) * 0.05
    dt[:, :, 0] *= 300
    dt[1, 0, 4] *= 1000
    dt[2, 1, 1] *= 700
    dt[0, 0, 2] *= 800
    A = -torch.rand(R, h, generator=gen, dtype=dtype) - 0.5
    B, C = (torch.randn(b, R, g, n, length, generator=gen, dtype=dtype) for _ in range(2))
    D = torch.randn(R, h, generator=gen, dtype=dtype)
    y, st = scan_forward(x, dt, A, B, C, D)
    assert st.wide.sum() == b * R + 3 and not st.wide.all()
    got = [y, *scan_backward(dy, x, dt, A, B, C, st, True)]
    for name, a, w in zip(['y', 'dx', 'ddt', 'dA', 'dB', 'dC', 'dD'], got,
                          _reference([x, dt, A, B, C, D], dy)):
        assert rel_err(a, w) <= tol, name


def test_ssd_scan_runs_the_native_chunked_scan_on_cpu():
    """Whatever the length and decay, the CPU ``ssd_scan`` runs the native chunked scan (no look
    at the step sizes: no host sync), exact to the recurrence and to the quadratic form."""
    args = gentle_inputs(100, seed=12)
    strong = [args[0], args[1] * 300.0, *args[2:]]  # every head decays too fast to factor
    want = ssd_scan_ref(*(t.double() for t in strong))
    with patch('mmdinomamba.ops.ssd.ssd_scan_chunked', side_effect=AssertionError):
        got = ssd_scan(*strong, backend='torch')
    assert rel_err(got, want) <= 1e-5 and rel_err(ssd_scan_quadratic(*strong), want) <= 1e-5


def test_strong_decay_stays_finite():
    x, dt, A, B, C, D = make_inputs(150, seed=9)
    y = ssd_scan_quadratic(x, dt * 1e3, A, B, C, D)
    want = ssd_scan_ref(x.double(), dt.double() * 1e3, A.double(), B.double(), C.double(),
                        D.double())
    assert torch.isfinite(y).all() and rel_err(y, want) <= 1e-5
