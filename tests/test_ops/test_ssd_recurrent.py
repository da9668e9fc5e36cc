"""The SSD scan by its recurrence in the native CPU kernels (heads of 16 channels with 16
states) == the sequential reference, outputs and gradients, both directions; its use by
BiSSD's CPU fast path; bad input."""
import pytest
import torch
import torch.nn.functional as F

from mmdinomamba.models.mixers import BiSSD
from mmdinomamba.ops import native_cpu, reference_ops
from mmdinomamba.ops.cpu.native_cpu import kernels
from mmdinomamba.ops.cpu import bidir_inner

from test_native_cpu import _grads, _record, _with_threads
from test_ssd_scan import assert_float32_close_to_float64, assert_float64_exact

pytestmark = pytest.mark.skipif(not native_cpu.available(), reason='no native CPU kernels')


def _channel_major(t):
    """(b, L, h, p) -> (b, 1, h, p, L), contiguous."""
    return t.permute(0, 2, 3, 1).unsqueeze(1).contiguous()


def _token_major(t):
    """(b, 1, h, p, L) -> (b, L, h, p)."""
    return t.squeeze(1).permute(0, 3, 1, 2)


class _RecurrentSSD(torch.autograd.Function):
    """The kernels as a causal scan in the layout of ``ssd_scan_ref``."""

    @staticmethod
    def forward(ctx, x, dt, A, B, C, D):
        args = (_channel_major(x), dt.transpose(1, 2).unsqueeze(1).contiguous(), A[None],
                _channel_major(B), _channel_major(C), None if D is None else D[None])
        ctx.save_for_backward(*args[:5], D)
        return _token_major(kernels().recurrent_scan_forward(*args))

    @staticmethod
    def backward(ctx, dy):
        x, dt, A, B, C, D = ctx.saved_tensors
        dx, ddt, dA, dB, dC, dD = kernels().recurrent_scan_backward(
            _channel_major(dy), x, dt, A, B, C, None if D is None else D[None])
        return (_token_major(dx), ddt.squeeze(1).transpose(1, 2), dA[0], _token_major(dB),
                _token_major(dC), None if D is None else dD[0])


def ssd_scan_recurrent(x, dt, A, B, C, D=None):
    return _RecurrentSSD.apply(x, dt, A, B, C, D)


def make_inputs(length, groups=1, heads=4, batch=2, with_d=True, strong=False, seed=0):
    """Heads of 16 channels with 16 states; ``strong``: dt |A| up to ~30 a token (weights far
    below float32's range within a few tokens), else Mamba-2's init ranges."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen)

    x = rnd(batch, length, heads, 16)
    if strong:
        dt = F.softplus(rnd(batch, length, heads) - 1.0)
        A = -torch.empty(heads).uniform_(1, 16, generator=gen)
    else:
        dt = torch.exp(torch.empty(batch, length, heads).uniform_(-6.9, -2.3, generator=gen))
        A = -torch.empty(heads).uniform_(1, 16, generator=gen)
    B, C = rnd(batch, length, groups, 16), rnd(batch, length, groups, 16)
    return [x, dt, A, B, C, rnd(heads) if with_d else None]


# lengths of one block of the backward pass (4), one token over (5), several, and a multiple
CASES = [(1, 1, False), (4, 1, True), (5, 2, False), (17, 1, False), (65, 2, True), (65, 1, False),
         (197, 4, True), (300, 2, False)]


@pytest.mark.parametrize('length,groups,strong', CASES)
def test_float64_equals_the_recurrence(length, groups, strong):
    assert_float64_exact(ssd_scan_recurrent, make_inputs(length, groups, strong=strong,
                                                         seed=length))


@pytest.mark.parametrize('length,groups,strong', CASES)
def test_float32_is_close_to_float64(length, groups, strong):
    ins = assert_float32_close_to_float64(ssd_scan_recurrent,
                                          make_inputs(length, groups, strong=strong, seed=length))
    if length == 1:  # y_0 does not depend on A
        assert ins[2].grad.abs().max() == 0


def test_without_skip_weights():
    assert_float64_exact(ssd_scan_recurrent, make_inputs(40, 2, with_d=False, strong=True))


def _both_directions(args, dy):
    """Output and gradients of the kernels on (b, 2, h, p, L) operands whose direction 1 is
    direction 0 on the flipped sequence."""
    x, dt, A, B, C, D = args

    def cm(t):  # (b, L, h, p) -> (b, h, p, L)
        return t.permute(0, 2, 3, 1)

    both = [torch.stack([cm(t), cm(t).flip(-1)], 1).contiguous() for t in (x, B, C, dy)]
    dt2 = torch.stack([dt.transpose(1, 2), dt.transpose(1, 2).flip(-1)], 1).contiguous()
    A2, D2 = torch.stack([A, A]), torch.stack([D, D])
    y = kernels().recurrent_scan_forward(both[0], dt2, A2, both[1], both[2], D2)
    grads = kernels().recurrent_scan_backward(both[3], both[0], dt2, A2, both[1], both[2], D2)
    return y, grads


def test_the_anti_causal_direction_is_the_causal_one_flipped():
    args = [t.double() for t in make_inputs(33, 2, strong=True, seed=5)]
    dy = torch.randn(args[0].shape, dtype=torch.float64)
    y, (dx, ddt, dA, dB, dC, dD) = _both_directions(args, dy)
    # direction 1 read in the flipped token order equals direction 0
    for t in (y, dx, dB, dC):
        torch.testing.assert_close(t[:, 1].flip(-1), t[:, 0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ddt[:, 1].flip(-1), ddt[:, 0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dA[1], dA[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dD[1], dD[0], rtol=1e-12, atol=1e-12)
    # and direction 0 is the reference scan
    ref = [t.clone().requires_grad_() for t in args]
    from mmdinomamba.ops import ssd_scan_ref
    y_ref = ssd_scan_ref(*ref)
    y_ref.backward(dy)
    torch.testing.assert_close(y[:, 0].permute(0, 3, 1, 2), y_ref.detach(), rtol=1e-10,
                               atol=1e-10)
    torch.testing.assert_close(dA[0], ref[2].grad, rtol=1e-9, atol=1e-10)


def test_results_do_not_depend_on_the_thread_count():
    args = make_inputs(65, 2, heads=8, batch=3, strong=True)
    dy = torch.randn(args[0].shape)
    one = _with_threads(1, lambda: _both_directions(args, dy))
    two = _with_threads(2, lambda: _both_directions(args, dy))
    for a, b in zip([one[0], *one[1]], [two[0], *two[1]]):
        assert torch.equal(a, b)


def test_bad_input_is_named():
    x = torch.randn(2, 1, 4, 16, 9)
    dt, A = torch.rand(2, 1, 4, 9), -torch.rand(1, 4)
    B = torch.randn(2, 1, 3, 16, 9)
    with pytest.raises(RuntimeError, match=r'the heads \(4\) must split into the groups \(3\)'):
        kernels().recurrent_scan_forward(x, dt, A, B, B, None)
    B = torch.randn(2, 1, 1, 16, 9)
    with pytest.raises(RuntimeError, match='C must be \\(2, 1, 1, 16, 9\\)'):
        kernels().recurrent_scan_forward(x, dt, A, B, B[..., :8], None)
    with pytest.raises(RuntimeError, match='A and D must be contiguous \\(1, 4\\)'):
        kernels().recurrent_scan_forward(x, dt, A, B, B, torch.randn(4))
    with pytest.raises(RuntimeError, match='dt must be a contiguous \\(b, R, h, L\\)'):
        kernels().recurrent_scan_forward(x, dt[..., :8], A, B, B, None)
    with pytest.raises(RuntimeError, match='dy must be a \\(b, R, h, p, L\\)'):
        kernels().recurrent_scan_backward(x[..., :8], x, dt, A, B, B, None)


def test_steps_equal_those_of_the_factors():
    gen = torch.Generator().manual_seed(2)
    raw = (torch.randn(3, 41, 10, generator=gen) * 4)[..., 3:8]
    raw[0, 5, 1] = 30.  # above softplus' threshold
    bias = torch.randn(2, 5, generator=gen)
    want = kernels().scan_factors(raw, bias, -torch.rand(2, 5, generator=gen), 100., True)[0]
    assert torch.equal(kernels().scan_factors(raw, bias, bias, 0., False)[0], want)


@pytest.mark.parametrize('dt_scale', [1.0, 50.0])
def test_fast_path_scans_small_heads_by_the_recurrence(monkeypatch, dt_scale):
    # the demo's heads: the fast path runs the recurrence, not the quadratic form, and equals
    # both the quadratic form and the reference
    m = BiSSD(embed_dims=32, d_state=16, headdim=16, ngroups=2).double()
    with torch.no_grad():  # dt_scale 50: strong decay, heads the quadratic form takes one by one
        for bias in (m.dt_bias, m.dt_b_bias):
            bias.add_(torch.log(torch.tensor(dt_scale, dtype=torch.float64)))
    x = torch.randn(3, 23, 32, dtype=torch.float64)
    calls = _record(monkeypatch, ('recurrent_scan_forward', 'recurrent_scan_backward',
                                  'masked_outer', 'products_forward', 'wide_forward'))
    got = _grads(m, x)
    assert calls == ['recurrent_scan_forward', 'recurrent_scan_backward']
    for quadratic in (True, False):
        calls.clear()
        if quadratic:  # the heads as the quadratic form takes them
            with monkeypatch.context() as patched:
                patched.setattr(bidir_inner, '_use_recurrent', lambda dims: False)
                want = _grads(m, x)
        else:
            with reference_ops():
                want = _grads(m, x)
        assert 'recurrent_scan_forward' not in calls
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_other_heads_keep_the_quadratic_form(monkeypatch):
    m = BiSSD(embed_dims=32, d_state=8, headdim=8).double()
    calls = _record(monkeypatch, ('recurrent_scan_forward', 'masked_outer'))
    _grads(m, torch.randn(2, 9, 32, dtype=torch.float64))
    assert 'recurrent_scan_forward' not in calls and 'masked_outer' in calls
