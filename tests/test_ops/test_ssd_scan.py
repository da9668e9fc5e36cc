"""SSD scan: portable chunked scan == naive float64 recurrence (outputs and gradients)."""
from unittest.mock import patch

import pytest
import torch
import torch.nn.functional as F

from mmdinomamba.ops import ssd_mixing_matrix, ssd_scan, ssd_scan_chunked, ssd_scan_ref
from mmdinomamba.ops.cpu.ssd_chunked import ssd_scan_chunked_native
from mmdinomamba.ops.reference import PORTABLE_CHUNK_SIZE

HEADS, HEADDIM, STATE = 4, 8, 16


def make_inputs(length, groups=1, batch=2, with_d=True, dtype=torch.float32, seed=0):
    """Random SSD inputs; dt spans gentle to strong decay (dt*|A| from ~1e-3 to ~30)."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=dtype)

    x = rnd(batch, length, HEADS, HEADDIM)
    dt = F.softplus(rnd(batch, length, HEADS) - 1.0)
    A = -torch.empty(HEADS, dtype=dtype).uniform_(1, 16, generator=gen)
    B, C = rnd(batch, length, groups, STATE), rnd(batch, length, groups, STATE)
    D = rnd(HEADS) if with_d else None
    return [x, dt, A, B, C, D]


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _with_grads(args, dtype):
    return [None if a is None else a.detach().to(dtype).requires_grad_() for a in args]


def assert_float32_close_to_float64(scan, args, grad_tol=1e-5):
    """``scan`` in float32 against the float64 recurrence: output within 1e-5 relative, every
    gradient within ``grad_tol``; returns the float32 inputs (with their gradients)."""
    ref_in, ins = _with_grads(args, torch.float64), _with_grads(args, torch.float32)
    y_ref = ssd_scan_ref(*ref_in)
    dy = torch.randn_like(y_ref)
    y_ref.backward(dy)
    y = scan(*ins)
    y.backward(dy.float())
    assert y.dtype == torch.float32 and rel_err(y, y_ref) <= 1e-5
    for name, a, r in zip('x dt A B C D'.split(), ins, ref_in):
        if a is not None:
            assert rel_err(a.grad, r.grad) <= grad_tol, name
    return ins


def assert_float64_exact(scan, args):
    """``scan`` in float64 == the recurrence, output and every gradient, to 1e-9."""
    ins, ref = _with_grads(args, torch.float64), _with_grads(args, torch.float64)
    dy = torch.randn(args[0].shape, dtype=torch.float64)
    y = scan(*ins)
    y.backward(dy)
    y_ref = ssd_scan_ref(*ref)
    y_ref.backward(dy)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    for a, r in zip(ins, ref):
        if a is not None:
            torch.testing.assert_close(a.grad, r.grad, rtol=1e-9, atol=1e-10)


def _native_chunked(x, dt, A, B, C, D=None, chunk_size=PORTABLE_CHUNK_SIZE, upcast=True):
    """``ssd_scan_chunked``'s signature, in the native kernels (float32 / float64 inside)."""
    dtype = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
    args = [None if t is None else t.to(dtype) for t in (x, dt, A, B, C, D)]
    with torch.autocast('cpu', enabled=False):
        return ssd_scan_chunked_native(*args, chunk_size).to(x.dtype)


@pytest.fixture(params=['native', 'torch'])
def chunked_kernels(request, monkeypatch):
    """The chunked scan in the native CPU kernels and in the PyTorch ops (its specification):
    ``ssd_scan_chunked`` of this module is the one or the other."""
    if request.param == 'native':
        monkeypatch.setitem(globals(), 'ssd_scan_chunked', _native_chunked)
    yield request.param


@pytest.mark.parametrize('length', [1, 17, 196, 197, 256, 1000])
@pytest.mark.parametrize('groups', [1, 2])
@pytest.mark.parametrize('with_d', [True, False])
def test_chunked_matches_reference(chunked_kernels, length, groups, with_d):
    args = make_inputs(length, groups, with_d=with_d)
    want = ssd_scan_ref(*[None if a is None else a.double() for a in args])
    got = ssd_scan(*args, backend='torch')
    assert got.dtype == torch.float32 and got.shape == args[0].shape
    assert rel_err(got, want) <= 1e-5


@pytest.mark.parametrize('length,groups,with_d', [(1, 1, True), (17, 2, True), (197, 1, False),
                                                  (256, 2, True), (1000, 1, True)])
def test_chunked_gradients_match_reference(chunked_kernels, length, groups, with_d):
    args = make_inputs(length, groups, with_d=with_d, seed=1)
    ref_in, ins = _with_grads(args, torch.float64), _with_grads(args, torch.float32)
    y_ref = ssd_scan_ref(*ref_in)
    dy = torch.randn_like(y_ref)
    y_ref.backward(dy)
    ssd_scan(*ins, backend='torch').backward(dy.float())
    for name, a, r in zip('x dt A B C D'.split(), ins, ref_in):
        if a is None:
            continue
        if length == 1 and name == 'A':  # y_0 does not depend on A
            assert a.grad.abs().max() == 0 and r.grad.abs().max() == 0
            continue
        assert rel_err(a.grad, r.grad) <= 1e-5, name


def test_gradients_with_ragged_chunks(chunked_kernels):
    """Several chunks, a ragged last one, states carried across them (float64, tight)."""
    args = _with_grads(make_inputs(150, groups=2, seed=2), torch.float64)
    ref = _with_grads(args, torch.float64)
    dy = torch.randn(2, 150, HEADS, HEADDIM, dtype=torch.float64)
    ssd_scan_chunked(*args, chunk_size=16).backward(dy)
    ssd_scan_ref(*ref).backward(dy)
    for a, r in zip(args, ref):
        torch.testing.assert_close(a.grad, r.grad, rtol=1e-9, atol=1e-10)


def test_several_samples_float64(chunked_kernels):
    assert_float64_exact(ssd_scan_chunked, make_inputs(300, groups=2, batch=5, seed=10))


@pytest.mark.parametrize('chunk_size', [1, 7, 16, 64, 300])
def test_chunk_size_does_not_change_result(chunked_kernels, chunk_size):
    args = make_inputs(131, groups=2, dtype=torch.float64, seed=3)
    want = ssd_scan_ref(*args)
    got = ssd_scan_chunked(*args, chunk_size=chunk_size)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_mixing_matrix_reproduces_scan():
    x, dt, A, B, C, D = make_inputs(67, groups=2, dtype=torch.float64, seed=4)
    M = ssd_mixing_matrix(dt, A, B, C)
    assert M.shape == (2, HEADS, 67, 67)
    assert torch.all(M.triu(1) == 0)
    y = torch.einsum('bhij,bjhp->bihp', M, x) + x * D[:, None]
    torch.testing.assert_close(y, ssd_scan_ref(x, dt, A, B, C, D), rtol=1e-10, atol=1e-10)
    # direct definition of one entry: M_ij = C_i.B_j exp(A sum_{k=j+1..i} dt_k) dt_j
    i, j, h = 40, 13, 3
    want = (C[0, i, 1] @ B[0, j, 1]) * torch.exp(A[h] * dt[0, j + 1:i + 1, h].sum()) * dt[0, j, h]
    torch.testing.assert_close(M[0, h, i, j], want)


def test_two_problems_as_extra_heads_and_groups():
    """Stacking two scans along heads (2x groups) equals two separate scans (BiSSD layout)."""
    p1, p2 = make_inputs(50, seed=5), make_inputs(50, seed=6)
    stacked = [torch.cat([a, b], dim=2 if a.dim() > 2 else 0) for a, b in zip(p1, p2)]
    got = ssd_scan(*stacked, backend='torch')
    torch.testing.assert_close(got[:, :, :HEADS], ssd_scan(*p1, backend='torch'))
    torch.testing.assert_close(got[:, :, HEADS:], ssd_scan(*p2, backend='torch'))


def test_backends_agree_on_cpu_and_triton_falls_back():
    args = make_inputs(40, seed=7)
    want = ssd_scan(*args, backend='torch')
    torch.testing.assert_close(ssd_scan(*args, backend='auto'), want)
    torch.testing.assert_close(ssd_scan(*args, backend='triton'), want)  # CPU: portable
    torch.testing.assert_close(ssd_scan(*args, backend='ref'), want, rtol=1e-5, atol=1e-5)
    assert PORTABLE_CHUNK_SIZE == 32


def test_half_precision_and_strided_inputs(chunked_kernels):
    x, dt, A, B, C, D = make_inputs(70, seed=8)
    want = ssd_scan(x, dt, A, B, C, D, backend='torch')
    got = ssd_scan(*(t.bfloat16() for t in (x, dt, A, B, C, D)), backend='torch')
    assert got.dtype == torch.bfloat16
    assert rel_err(got, want) < 2e-2
    x_strided = x.transpose(0, 1).contiguous().transpose(0, 1)  # same values, other strides
    torch.testing.assert_close(ssd_scan(x_strided, dt, A, B, C, D, backend='torch'), want)


def test_autocast_does_not_lower_scan_precision(chunked_kernels):
    """Under bf16 autocast the portable scan still computes (and saves states) in float32:
    outputs and gradients equal the run without autocast; a bf16 backward used to crash."""
    args = make_inputs(150, groups=2, seed=11)
    plain, auto = _with_grads(args, torch.float32), _with_grads(args, torch.float32)
    want = ssd_scan(*plain, backend='torch')
    with torch.autocast('cpu', dtype=torch.bfloat16):
        got = ssd_scan(*auto, backend='torch')
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    gy = torch.randn_like(want)
    want.backward(gy)
    got.backward(gy)
    for a, b in zip(auto, plain):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


def test_no_grad_forward_and_strong_decay_are_finite(chunked_kernels):
    x, dt, A, B, C, D = make_inputs(300, seed=9)
    with torch.no_grad():
        y = ssd_scan(x, dt * 1e3, A, B, C, D, backend='torch')  # decays far below exp(-60)
    want = ssd_scan_ref(x.double(),
                        dt.double() * 1e3, A.double(), B.double(), C.double(), D.double())
    assert torch.isfinite(y).all() and rel_err(y, want) <= 1e-5


@pytest.mark.parametrize('bad,match', [
    (dict(backend='cuda'), 'backend must be one of'),
    (dict(dt=torch.ones(2, 5, 3)), 'dt must be'),
    (dict(A=torch.ones(3)), 'A must be'),
    (dict(B=torch.ones(2, 5, 3, 16), C=torch.ones(2, 5, 3, 16)), 'multiple of groups'),
    (dict(D=torch.ones(2)), 'D must be'),
])
def test_clear_errors(bad, match):
    x, dt, A, B, C, D = make_inputs(5)
    kw = dict(x=x, dt=dt, A=A, B=B, C=C, D=D)
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
        ssd_scan(**kw)


def _gentle(length, groups, seed, dtype=torch.float32):
    """Mamba-2 init ranges: dt in [1e-3, 0.1], A in [-16, -1]."""
    args = make_inputs(length, groups, seed=seed, dtype=dtype)
    gen = torch.Generator().manual_seed(seed + 100)
    args[1] = torch.exp(torch.empty(args[1].shape, dtype=dtype).uniform_(-6.9, -2.3,
                                                                         generator=gen))
    return args


@pytest.mark.parametrize('length,groups', [(100, 1), (700, 2)])
def test_gentle_decays_float32_match_float64_recurrence(chunked_kernels, length, groups):
    """Long memories (little decay within and across chunks) keep float32 accuracy, outputs and
    every gradient."""
    assert_float32_close_to_float64(ssd_scan_chunked, _gentle(length, groups, seed=11))


def test_gentle_and_strongly_decaying_chunks_in_one_scan_float64(chunked_kernels):
    """One chunk decays by hundreds per token (decay weights far below exp(-60), its upper
    triangle's exponents far above 0), the others gently; states cross it: tight in float64."""
    args = _gentle(160, 2, seed=12, dtype=torch.float64)
    args[1][:, 96:128] *= 400.0  # the fourth chunk of 32 tokens
    assert_float64_exact(lambda *a: ssd_scan_chunked(*a, chunk_size=32), args)


def test_native_states_are_kept_in_pieces():
    """The native scan keeps the states entering its chunks in pieces of at most 16 MiB (here
    float64 states of 1 MiB per chunk: 16 chunks a piece); the backward pass reads them all:
    gradients equal the recurrence's."""
    from mmdinomamba.ops.cpu.native_cpu import kernels
    gen = torch.Generator().manual_seed(13)
    length, h, p, n = 81, 32, 64, 64  # 41 chunks of two tokens (the last one ragged)
    args = [torch.randn(1, length, h, p, generator=gen, dtype=torch.float64),
            torch.rand(1, length, h, generator=gen, dtype=torch.float64) / 10,
            -torch.linspace(1, 8, h, dtype=torch.float64),
            *(torch.randn(1, length, 1, n, generator=gen, dtype=torch.float64) for _ in range(2)),
            torch.randn(h, generator=gen, dtype=torch.float64)]
    _, states = kernels().chunk_scan_forward(*args, 2, True)
    assert [s.shape[1] for s in states] == [16, 16, 9]
    assert all(s.numel() * s.element_size() <= 16 << 20 for s in states)
    assert_float64_exact(lambda *a: ssd_scan_chunked_native(*a, chunk_size=2), args)
