"""The native CPU kernels (conv + SiLU, gated merge, the scan's products, factors and strongly
decaying heads, the chunked scan) == the reference (forward and backward), their use by BiSSD's
CPU fast path, bad input, and the fallback when they cannot be built or are switched off."""
import math
import subprocess
import warnings

import pytest
import torch
import torch.nn.functional as F

from mmdinomamba.models.mixers import BiSSD
from mmdinomamba.ops import reference_ops, switch
from mmdinomamba.ops.cpu import native_cpu
from mmdinomamba.ops.cpu.native_cpu import kernels
from mmdinomamba.ops.reference import bidir_causal_conv1d_ref, bidir_gated_merge_ref


def test_kernels_build_on_this_machine():
    # the set-up installs g++ and ninja: a failed build here is a fault, not a skip
    assert native_cpu.available(), native_cpu.load_error()


def test_loading_them_keeps_subnormal_floats():
    # a shared library linked with -ffast-math would set flush-to-zero for the whole process
    assert native_cpu.available()
    tiny = torch.tensor([1e-38]) * 1e-5
    assert 0 < tiny.item() < 1e-42


def _composition(x, w, b, dact):
    """act (b, 2, C, L), dx (token-major, like x), dweight, dbias of the reference conv
    (direction 1 on the flipped sequence, read back in the original order) and autograd."""
    leaves = [t.detach().clone().requires_grad_() for t in (x, w, b) if t is not None]
    out = F.silu(bidir_causal_conv1d_ref(leaves[0], leaves[1], None if b is None else leaves[2],
                                         (x.shape[-1], ), None))
    c = x.shape[-1]
    act = torch.stack([out[..., :c], out[..., c:].flip(1)], 1).transpose(2, 3)
    grads = torch.autograd.grad(act, leaves, dact)
    return [act.detach(), *grads, *([None] if b is None else [])]


def _native_conv(x, w, b, dact):
    dx = torch.full(x.shape, float('nan'), dtype=x.dtype)
    dw, *db = kernels().conv_silu_backward([dact], x, w, b, dx)
    return [kernels().conv_silu_forward(x, w, b), dx, dw, *(db or [None])]


def _column_products(a, m, bounds, transpose, prefix_first):
    out = a.new_empty(a.shape)
    kernels().column_products(a, m, out, bounds, transpose, prefix_first)
    return out


def _masked_outer(dy, x, bounds):
    out = dy.new_empty(*dy.shape[:3], dy.shape[-1], dy.shape[-1])
    diag = dy.new_empty(*dy.shape[:3], dy.shape[-1])
    kernels().masked_outer(dy, x, out, bounds, diag)
    return out, diag


@pytest.mark.parametrize('dtype,tol', [(torch.float64, 1e-12), (torch.float32, 2e-6)])
@pytest.mark.parametrize('kernel', [2, 3, 4])
@pytest.mark.parametrize('with_bias', [True, False])
def test_equals_the_composition(dtype, tol, kernel, with_bias):
    # the input a token-major view into a wider tensor (as into the projection); 37 tokens and
    # 20 channels: full and partial blocks of 16
    x = torch.randn(3, 37, 29, dtype=dtype)[..., 4:24]
    w = torch.randn(2, 20, kernel, dtype=dtype)
    b = torch.randn(2, 20, dtype=dtype) if with_bias else None
    dact = torch.randn(3, 2, 20, 37, dtype=dtype)
    want = _composition(x, w, b, dact)
    got = _native_conv(x, w, b, dact)
    assert (got[-1] is None) == (not with_bias)
    for name, g, r in zip(['act', 'dx', 'dweight', 'dbias'], got, want):
        if r is not None:
            torch.testing.assert_close(g, r, rtol=tol, atol=tol * r.abs().max().item(),
                                       msg=name)


@pytest.mark.parametrize('sizes', [(20,), (7, 5, 8), (16, 2, 2)])
def test_conv_reads_its_output_gradient_in_channel_parts(sizes):
    # the scan's du, dB, dC as separate tensors (one not contiguous); part boundaries inside
    # and on the 16-channel blocks
    x, w, b = torch.randn(3, 37, 20), torch.randn(2, 20, 3), torch.randn(2, 20)
    dact = torch.randn(3, 2, 20, 37)
    parts = list(dact.split(sizes, dim=2))
    parts[-1] = parts[-1].transpose(0, 1).contiguous().transpose(0, 1)
    want = _native_conv(x, w, b, dact)
    dx = torch.full(x.shape, float('nan'))
    got = [dx, *kernels().conv_silu_backward(parts, x, w, b, dx)]
    for g, r in zip(got, want[1:]):
        torch.testing.assert_close(g, r, rtol=0, atol=0)


def test_conv_writes_its_input_gradient_into_a_view():
    # dx as a (b, L, C) view into a wider buffer (the projection's gradient): nothing outside
    x, w, b = torch.randn(2, 33, 40), torch.randn(2, 40, 4), torch.randn(2, 40)
    dact = torch.randn(2, 2, 40, 33)
    grad = torch.zeros(2, 33, 60)
    kernels().conv_silu_backward([dact], x, w, b, grad[..., 7:47])
    torch.testing.assert_close(grad[..., 7:47], _composition(x, w, b, dact)[1], rtol=1e-5,
                               atol=1e-5)
    assert (grad[..., :7] == 0).all() and (grad[..., 47:] == 0).all()


def test_saturated_activations_stay_finite():
    # pre-activations of +-1e4: exp overflows inside SiLU, its value and gradient do not
    x = torch.randn(2, 9, 4) * 1e4
    w, b = torch.ones(2, 4, 4), torch.zeros(2, 4)
    dact = torch.randn(2, 2, 4, 9)
    want = _composition(x, w, b, dact)
    got = _native_conv(x, w, b, dact)
    for g, r in zip(got, want):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5 * r.abs().max().item())


def test_bad_input_is_named():
    x = torch.randn(2, 9, 4)
    with pytest.raises(RuntimeError, match='weight must be a contiguous \\(2, C, K\\)'):
        kernels().conv_silu_forward(x, torch.randn(2, 5, 4), None)
    with pytest.raises(RuntimeError, match='x must be a \\(b, L, C\\)'):
        kernels().conv_silu_forward(x.transpose(1, 2), torch.randn(2, 9, 4), None)
    with pytest.raises(RuntimeError, match='kernel sizes 2-4 only, got 5'):
        kernels().conv_silu_forward(x, torch.randn(2, 4, 5), None)
    with pytest.raises(RuntimeError, match='each part of dact must be \\(b, 2, C_i, L\\)'):
        kernels().conv_silu_backward([torch.randn(2, 2, 4, 10)], x, torch.randn(2, 4, 4), None,
                                     torch.empty(2, 9, 4))
    with pytest.raises(RuntimeError, match='the parts of dact cover 3 channels, x has 4'):
        kernels().conv_silu_backward([torch.randn(2, 2, 1, 9), torch.randn(2, 2, 2, 9)], x,
                                     torch.randn(2, 4, 4), None, torch.empty(2, 9, 4))
    with pytest.raises(RuntimeError, match='dx must be a \\(b, L, C\\)'):
        kernels().conv_silu_backward([torch.randn(2, 2, 4, 9)], x, torch.randn(2, 4, 4), None,
                                     torch.empty(2, 4, 9))


@pytest.mark.parametrize('dtype,tol', [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_scan_factors_equal_the_composition(dtype, tol):
    # dt of both directions from a token-major view into a wider tensor (the projection), and
    # the quadratic scan's factors of it: heads 0 decay too strongly to factor
    from mmdinomamba.ops.cpu.ssd_quadratic import FACTORED_RANGE, _factors
    gen = torch.Generator().manual_seed(3)
    raw = (torch.randn(3, 41, 10, generator=gen, dtype=dtype) * 4)[..., 3:8]
    raw[0, 5, 1] = 30.  # above softplus' threshold
    bias = torch.randn(2, 5, generator=gen, dtype=dtype)
    A = -torch.rand(2, 5, generator=gen, dtype=dtype) * 2
    A[:, 0] = -50.
    got = kernels().scan_factors(raw, bias, A, FACTORED_RANGE)
    dt = F.softplus(raw.transpose(1, 2).unsqueeze(1) + bias[..., None])
    want = [dt, *_factors(dt, A)]
    assert got[4][:, :, 0].all() and not got[4].all()  # both kinds of heads
    assert torch.equal(got[4], want[4])
    for name, g, r in zip(['dt', 'S', 'row', 'col'], got, want):
        assert g.dtype == r.dtype and g.shape == r.shape, name
        torch.testing.assert_close(g, r, rtol=tol, atol=tol * r.abs().max().item(), msg=name)


def test_scan_factors_bad_input_is_named():
    raw, p = torch.randn(2, 9, 4), torch.randn(2, 4)
    with pytest.raises(RuntimeError, match='raw must be a \\(b, L, C\\)'):
        kernels().scan_factors(raw.transpose(1, 2), p, p, 100.)
    with pytest.raises(RuntimeError, match='dt_bias and A must be contiguous \\(2, h\\)'):
        kernels().scan_factors(raw, torch.randn(2, 5), p, 100.)


def _merge_reference(y, z, w, dm, groups):
    """Output, dy, dz and dweight of the reference merge (``y`` channel-major (b, 2, d, L), the
    backward direction read at the flipped token) and autograd."""
    leaves = [t.detach().clone().requires_grad_() for t in (y, z, w)]
    yl = leaves[0].transpose(2, 3)
    out = bidir_gated_merge_ref(torch.cat([yl[:, 0], yl[:, 1].flip(1)], -1), leaves[1],
                                leaves[2], 1e-5, y.shape[2] // groups)
    return [out.detach(), *torch.autograd.grad(out, leaves, dm)]


def _merge_backward(dm, y, z, w, groups, eps, dz, out):
    """The merge's backward kernel for an explicit ``y`` (b, 2, d, L): ``merge_backward_scan``
    of the scan state ``ys = y``, ``row = 1``, ``diag = 0`` (one head of d channels)."""
    ys = y.unflatten(2, (1, -1))
    plane = y.new_ones(y.shape[0], 2, 1, y.shape[-1])
    return kernels().merge_backward_scan(dm, ys, plane, torch.zeros_like(ys), 0 * plane,
                                         torch.zeros(plane.shape[:3], dtype=torch.bool), None, z,
                                         w, groups, eps, dz, out)


def _merge_both(y, z, w, dm, groups):
    """Output, dy, dz, dweight and the output as the backward pass rebuilds it, of the native
    merge, and the reference's (its output again in the last place)."""
    out, dz, again = (torch.full(dm.shape, float('nan'), dtype=y.dtype) for _ in range(3))
    kernels().merge_forward(y, z, w, groups, 1e-5, out)
    dy, dweight = _merge_backward(dm, y, z, w, groups, 1e-5, dz, again)
    want = _merge_reference(y, z, w, dm, groups)
    return [out, dy, dz, dweight, again], [want[0], want[1], want[2], want[3], want[0]]


@pytest.mark.parametrize('dtype,tol', [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize('groups,length', [(1, 150), (2, 7), (4, 64), (1, 17)])
def test_merge_equals_the_composition(dtype, tol, groups, length):
    # 150 tokens: nine full tiles of 16 and a partial one; z and dm token-major views into wider
    # tensors (as into the projection and its gradient), 40 channels: partial transpose tiles
    d = 40 if groups != 4 else 24
    y = torch.randn(3, 2, d, length, dtype=dtype)
    z = (torch.randn(3, length, d + 9, dtype=dtype) * 3)[..., 5:5 + d]
    w = torch.randn(2, d, dtype=dtype)
    dm = torch.randn(3, length, 2 * d, dtype=dtype)[..., ::2].contiguous()
    got, want = _merge_both(y, z, w, dm, groups)
    for name, g, r in zip(['out', 'dy', 'dz', 'dweight', 'out rebuilt'], got, want):
        torch.testing.assert_close(g, r, rtol=tol, atol=tol * r.abs().max().item(), msg=name)
    # the backward pass rebuilds the output the forward pass gave, to rounding
    torch.testing.assert_close(got[4], got[0], rtol=tol, atol=tol * got[0].abs().max().item())


def test_merge_writes_into_views_of_the_projections():
    # out and dz as (b, L, d) views into wider buffers: nothing outside them is touched
    y, z = torch.randn(2, 2, 32, 70), torch.randn(2, 70, 32)
    w, dm = torch.randn(2, 32), torch.randn(2, 70, 32)
    buf = torch.zeros(2, 70, 50)
    kernels().merge_forward(y, z, w, 1, 1e-5, buf[..., 10:42])
    want = _merge_reference(y, z, w, dm, 1)[0]
    torch.testing.assert_close(buf[..., 10:42], want, rtol=1e-5, atol=1e-5)
    assert (buf[..., :10] == 0).all() and (buf[..., 42:] == 0).all()
    grad, again = torch.zeros(2, 70, 50), torch.zeros(2, 70, 40)
    _merge_backward(dm, y, z, w, 1, 1e-5, grad[..., 3:35], again[..., 4:36])
    assert (grad[..., :3] == 0).all() and (grad[..., 35:] == 0).all()
    torch.testing.assert_close(again[..., 4:36], want, rtol=1e-5, atol=1e-5)
    assert (again[..., :4] == 0).all() and (again[..., 36:] == 0).all()


def test_merge_with_saturated_gates_stays_finite():
    # gates z of +-1e4: exp overflows inside SiLU, the merge's value and gradients do not
    y, z = torch.randn(2, 2, 24, 9), torch.randn(2, 9, 24) * 1e4
    w, dm = torch.randn(2, 24), torch.randn(2, 9, 24)
    got, want = _merge_both(y, z, w, dm, 2)
    for g, r in zip(got, want):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5 * r.abs().max().item())


def test_merge_bad_input_is_named():
    y, z, w = torch.randn(2, 2, 8, 5), torch.randn(2, 5, 8), torch.randn(2, 8)
    out = torch.empty(2, 5, 8)
    with pytest.raises(RuntimeError, match='3 groups do not divide d = 8'):
        kernels().merge_forward(y, z, w, 3, 1e-5, out)
    with pytest.raises(RuntimeError, match=r'z must be a \(b, L, C\) = \(2, 5, 8\)'):
        kernels().merge_forward(y, z.transpose(1, 2).contiguous(), w, 1, 1e-5, out)
    with pytest.raises(RuntimeError, match=r'out must be a \(b, L, C\)'):
        kernels().merge_forward(y, z, w, 1, 1e-5, out.transpose(1, 2).contiguous())
    with pytest.raises(RuntimeError, match=r'dm must be a \(b, L, C\)'):
        _merge_backward(torch.randn(2, 4, 8), y, z, w, 1, 1e-5, out, None)
    with pytest.raises(RuntimeError, match=r'dz must be a \(b, L, C\)'):
        _merge_backward(torch.randn(2, 5, 8), y, z, w, 1, 1e-5, out[..., ::2], None)
    with pytest.raises(RuntimeError, match=r'out must be a \(b, L, C\) = \(2, 5, 8\)'):
        _merge_backward(torch.randn(2, 5, 8), y, z, w, 1, 1e-5, out, torch.empty(2, 5, 7))


def _scan_output_operands(dtype, gen, shape=(3, 2, 4, 5, 70)):
    """The quadratic scan's state for the merge's backward pass: ``x`` a view into a wider
    conv output, ``ys``, ``row``, ``diag``, a ``wide`` mask (several heads per direction, rows
    zero there) and the wide heads' ``parts``, and the merge's ``dm``, ``z`` (a view into a
    wider projection) and weight."""
    x, (ys, *_), (row, diag) = _scan_operands(dtype, gen, shape)
    b, R, h, p, L = shape
    wide = torch.zeros(b, R, h, dtype=torch.bool)
    wide[0, 0, 1] = wide[2, 0, 3] = wide[1, 1, 0] = wide[1, 1, 2] = wide[2, 1, 2] = True
    row = row.masked_fill(wide[..., None], 0.)
    parts = torch.randn(int(wide.sum()), p, L, generator=gen).to(dtype)
    proj = torch.randn(b, L, h * p + 9, generator=gen).to(dtype)
    dm = torch.randn(b, L, h * p, generator=gen).to(dtype)
    nw = torch.randn(2, h * p, generator=gen).to(dtype)
    return x, ys, row, diag, wide, parts, dm, proj[..., 4:4 + h * p], nw


@pytest.mark.parametrize('dtype,tol', [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize('groups', [1, 4])
def test_merge_backward_of_the_scan_state_equals_the_composition(dtype, tol, groups):
    """The merge's backward pass with ``y`` rebuilt inside (``ys row + x diag``, plus the wide
    heads' parts in their order) == the scan's output written first, then the merge's backward
    pass of it;
    ``out`` too."""
    x, ys, row, diag, wide, parts, dm, z, nw = _scan_output_operands(
        dtype, torch.Generator().manual_seed(groups))
    assert not x.is_contiguous() and not z.is_contiguous()
    y = _scan_output(ys, row, x, diag)
    y.transpose(0, 1)[wide.transpose(0, 1)] += parts  # by direction, then sample, then head
    dz, out = torch.empty_like(dm), torch.empty_like(dm)
    want = [*_merge_backward(dm, y.flatten(2, 3), z, nw, groups, 1e-5, dz, out), dz, out]
    dz2, out2 = torch.full_like(dm, float('nan')), torch.full_like(dm, float('nan'))
    got = [*kernels().merge_backward_scan(dm, ys, row, x, diag, wide, parts, z, nw, groups,
                                          1e-5, dz2, out2), dz2, out2]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol * w.abs().max().item())
    # no wide head: no parts needed
    none = torch.zeros_like(wide)
    y = _scan_output(ys, row, x, diag)
    want = _merge_backward(dm, y.flatten(2, 3), z, nw, groups, 1e-5, dz, None)[0]
    got = kernels().merge_backward_scan(dm, ys, row, x, diag, none, None, z, nw, groups, 1e-5,
                                        dz2, None)[0]
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * want.abs().max().item())


def test_merge_backward_of_the_scan_state_bad_input_is_named():
    x, ys, row, diag, wide, parts, dm, z, nw = _scan_output_operands(
        torch.float32, torch.Generator().manual_seed(0))
    dz = torch.empty_like(dm)
    with pytest.raises(RuntimeError,
                       match=r'parts must be a contiguous \(5, 5, 70\) CPU tensor'):
        kernels().merge_backward_scan(dm, ys, row, x, diag, wide, parts[1:], z, nw, 1, 1e-5, dz,
                                      None)
    with pytest.raises(RuntimeError, match=r'parts must be .* for the 5 wide heads'):
        kernels().merge_backward_scan(dm, ys, row, x, diag, wide, None, z, nw, 1, 1e-5, dz, None)
    with pytest.raises(RuntimeError,
                       match=r'wide must be a contiguous \(b, 2, h\) bool CPU tensor'):
        kernels().merge_backward_scan(dm, ys, row, x, diag, wide.float(), parts, z, nw, 1,
                                      1e-5, dz, None)
    # tensors on another device are refused before any of their memory is read
    with pytest.raises(RuntimeError, match=r'wide must be .* bool CPU tensor'):
        kernels().merge_backward_scan(dm, ys, row, x, diag, wide.to('meta'), parts, z, nw, 1,
                                      1e-5, dz, None)
    with pytest.raises(RuntimeError, match=r'row must be a contiguous \(b, R, h, L\) CPU tensor'):
        kernels().merge_backward_scan(dm, ys, row.to('meta'), x, diag, wide, parts, z, nw, 1,
                                      1e-5, dz, None)
    with pytest.raises(RuntimeError, match=r'ys must be a \(b, R, h, p, L\) CPU tensor like x'):
        kernels().merge_backward_scan(dm, ys[..., :-1], row, x, diag, wide, parts, z, nw, 1,
                                      1e-5, dz, None)
    with pytest.raises(RuntimeError, match=r'z must be a \(b, L, C\) = \(3, 70, 20\)'):
        kernels().merge_backward_scan(dm, ys, row, x, diag, wide, parts, z[:, :-1], nw, 1,
                                      1e-5, dz, None)
    with pytest.raises(RuntimeError, match='3 groups do not divide d = 20'):
        kernels().merge_backward_scan(dm, ys, row, x, diag, wide, parts, z, nw, 3, 1e-5, dz, None)
    with pytest.raises(RuntimeError, match=r'both directions \(b, 2, h, p, L\)'):
        kernels().merge_backward_scan(dm, ys[:, :1], row[:, :1].contiguous(), x[:, :1],
                                      diag[:, :1].contiguous(), wide[:, :1].contiguous(), None,
                                      z, nw, 1, 1e-5, dz, None)


def _scan_output(ys, row, x, diag):
    """The quadratic scan's output ``ys row + x diag`` (per-token ``row`` and ``diag``)."""
    return ys * row.unsqueeze(-2) + x * diag.unsqueeze(-2)


def _scan_operands(dtype, gen, shape=(3, 2, 4, 5, 37)):
    """(b, R, h, p, L) operands of the scan's element-wise kernels, ``x`` a view with contiguous
    (p, L) planes inside a wider tensor (as the conv output's channels are)."""
    channels = shape[2] * shape[3]
    wide = torch.randn(shape[0], shape[1], channels + 6, shape[4], generator=gen).to(dtype)
    x = wide[:, :, 3:3 + channels].unflatten(2, shape[2:4])
    big = [torch.randn(shape, generator=gen).to(dtype) for _ in range(4)]
    small = [torch.randn(*shape[:3], shape[4], generator=gen).to(dtype) for _ in range(2)]
    return x, big, small


@pytest.fixture
def gemm_path():
    """The GEMMs of the native products (torch's BLAS where its symbols are found, else
    at::mm_out)."""
    return 'gemm'


def _triangles(t):
    """Direction 0's strict lower and direction 1's strict upper triangle of ``t`` (b, R, g, L,
    L), zero elsewhere."""
    out = t.tril(-1)
    if t.shape[1] == 2:
        out[:, 1] = t[:, 1].triu(1)
    return out


@pytest.mark.parametrize('dtype,tol', [(torch.float64, 1e-12), (torch.float32, 2e-6)])
@pytest.mark.parametrize('dirs,groups,length', [(2, 1, 197), (2, 2, 130), (1, 2, 65), (2, 1, 7)])
def test_products_equal_the_composition(gemm_path, dtype, tol, dirs, groups, length):
    # the (L, L) products of the quadratic scan against torch.matmul, in one block (65, 7
    # tokens) and in two or three blocks (130, 197); the operands views with strides outside
    # their planes (as the scan's grouped heads are)
    from mmdinomamba.ops.cpu.ssd_quadratic import block_bounds
    gen = torch.Generator().manual_seed(length)
    wide = torch.randn(3, dirs, groups, 20, length, generator=gen, dtype=dtype)
    x, y = wide[..., :12, :], wide[..., 8:, :]
    assert not x.is_contiguous()
    cb = _triangles(torch.randn(3, dirs, groups, length, length, generator=gen, dtype=dtype))
    bounds = block_bounds(length)

    def close(got, want):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol * want.abs().max().item())

    close(_column_products(x, cb, bounds, True, True), x @ cb.mT)
    close(_column_products(x, cb, bounds, False, False), x @ cb)
    full = x.mT @ y
    got, diag = _masked_outer(x, y, bounds)
    close(got, _triangles(full))
    close(diag, full.diagonal(dim1=-2, dim2=-1))


def test_products_bad_input_is_named():
    x, cb = torch.randn(2, 2, 1, 8, 9), torch.randn(2, 2, 1, 9, 9)
    with pytest.raises(RuntimeError, match='the matrices must be a \\(b, R, g, 9, 9\\)'):
        _column_products(x, cb[..., :8], [0, 9], True, True)
    with pytest.raises(RuntimeError, match='block bounds must rise strictly from 0 to the '
                                           'length 9'):
        _column_products(x, cb, [0, 5, 5, 9], True, True)
    with pytest.raises(RuntimeError, match='the second operand must be a \\(b, R, g, 8, 9\\) '
                                           'CPU tensor of the first operand\'s dtype'):
        _masked_outer(x, x.double(), [0, 9])
    with pytest.raises(RuntimeError, match='first operand must be a \\(b, R, g, P, L\\) '
                                           'float32 or float64'):
        _masked_outer(x.bfloat16(), x.bfloat16(), [0, 9])
    strided = x.mT.contiguous().mT  # no unit stride along L
    for fn in (lambda: _masked_outer(strided, x, [0, 9]),
               lambda: _column_products(strided, cb, [0, 9], True, True)):
        with pytest.raises(RuntimeError, match='the first operand must be a \\(b, R, g, 8, 9\\)'):
            fn()


def _scan_inputs(b, length, h, g, dtype, seed=0):
    """Chunked-scan inputs: x, dt, A, B, C, D and an output gradient; head 0 decays by about 50
    per token (its weights mostly clamped), the others gently to strongly."""
    gen = torch.Generator().manual_seed(seed)
    x, dy = (torch.randn(b, length, h, 8, generator=gen, dtype=dtype) for _ in range(2))
    dt = F.softplus(torch.randn(b, length, h, generator=gen, dtype=dtype) - 1)
    dt[..., 0] = 50 / 16
    A = -torch.linspace(16, 1, h, dtype=dtype)
    B, C = (torch.randn(b, length, g, 6, generator=gen, dtype=dtype) for _ in range(2))
    return x, dt, A, B, C, torch.randn(h, generator=gen, dtype=dtype), dy


def _scan_pytorch(args, Q):
    """Output and gradients of the chunked scan in PyTorch (its specification)."""
    from mmdinomamba.ops.reference import ssd_scan_chunked
    *ins, dy = [t.clone().requires_grad_() for t in args]
    y = ssd_scan_chunked(*ins, chunk_size=Q)
    return [y.detach(), *torch.autograd.grad(y, ins, dy)]


def _scan_native(args, Q):
    *ins, dy = args
    y, states = kernels().chunk_scan_forward(*ins, Q, True)
    return [y, *kernels().chunk_scan_backward(dy, *ins, states, Q)]


@pytest.mark.parametrize('dtype,tol', [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize('b,length,h,g,Q', [(2, 45, 4, 2, 8), (1, 200, 6, 1, 32),
                                            (3, 5, 2, 1, 32), (1, 64, 3, 1, 16)])
def test_chunk_scan_equals_the_composition(gemm_path, dtype, tol, b, length, h, g, Q):
    # ragged last chunks, one short chunk, groups; batch 1 runs in head slices on two threads
    # (the last case in slices of one and two heads)
    args = _scan_inputs(b, length, h, g, dtype)
    got, want = _scan_native(args, Q), _scan_pytorch(args, Q)
    for name, a, r in zip(['y', 'dx', 'ddt', 'dA', 'dB', 'dC', 'dD'], got, want):
        assert a.dtype == dtype and a.shape == r.shape, name
        torch.testing.assert_close(a, r, rtol=tol, atol=tol * r.abs().max().item(), msg=name)


def test_chunk_scan_runs_in_head_slices_on_idle_threads():
    # batch 1, one group: 1, 2 and 3 threads split the 5 heads into 1, 2 and 3 slices, whose
    # gradients of B and C are summed afterwards (the only results that change with them)
    args = _scan_inputs(1, 70, 5, 1, torch.float64)
    want = _scan_pytorch(args, 16)
    for threads in (1, 2, 3):
        got = _with_threads(threads, lambda: _scan_native(args, 16))
        for a, r in zip(got, want):
            torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12 * r.abs().max().item())


def test_chunk_scan_bad_input_is_named():
    *ins, dy = _scan_inputs(1, 20, 4, 2, torch.float32)
    x, dt, A, B, C, D = ins
    with pytest.raises(RuntimeError, match='dt must be a contiguous CPU tensor of x\'s dtype '
                                           'with shape \[1, 20, 4\]'):
        kernels().chunk_scan_forward(x, dt.double(), A, B, C, D, 8, True)
    with pytest.raises(RuntimeError, match='B must be \(b, L, g, n\) with g dividing the heads'):
        kernels().chunk_scan_forward(x, dt, A, torch.randn(1, 20, 3, 6), C, D, 8, True)
    with pytest.raises(RuntimeError, match='C must be .* \(not contiguous\)'):
        kernels().chunk_scan_forward(x, dt, A, B, C.mT.contiguous().mT, D, 8, True)
    with pytest.raises(RuntimeError, match='x must be \(b, L, h, p\) float32 or float64'):
        kernels().chunk_scan_forward(x.bfloat16(), dt, A, B, C, D, 8, True)
    with pytest.raises(RuntimeError, match='chunk must be >= 1'):
        kernels().chunk_scan_forward(x, dt, A, B, C, D, 0, True)
    _, states = kernels().chunk_scan_forward(x, dt, A, B, C, D, 8, True)
    with pytest.raises(RuntimeError, match='the states must be the pieces chunk_scan_forward '
                                           'kept'):
        kernels().chunk_scan_backward(dy, x, dt, A, B, C, D, [], 8)
    with pytest.raises(RuntimeError, match='the states must be the pieces'):
        kernels().chunk_scan_backward(dy, x, dt, A, B, C, D, states, 4)  # other chunks
    with pytest.raises(RuntimeError, match='a state piece must be a contiguous CPU tensor'):
        kernels().chunk_scan_backward(dy, x, dt, A, B, C, D, [states[0][:, :, :1]], 8)
    with pytest.raises(RuntimeError, match='dy must be'):
        kernels().chunk_scan_backward(dy[:, :10], x, dt, A, B, C, D, states, 8)


def _with_threads(n, fn):
    """``fn()`` with torch's intra-op thread count set to ``n``."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


def test_kernels_are_built_with_openmp():
    # at::parallel_for is a header template: in a file built without OpenMP it runs every loop
    # on the calling thread, and the kernels would use one core whatever torch is told
    ldd = subprocess.run(['ldd', native_cpu.load().__file__], capture_output=True, text=True)
    if ldd.returncode != 0:
        pytest.skip('no ldd here')
    assert 'libgomp' in ldd.stdout


def test_results_do_not_depend_on_the_thread_count():
    # every output (and every per-sample or per-run partial sum) is computed by one thread in a
    # fixed order: one and two threads give the same bits
    gen = torch.Generator().manual_seed(0)
    xc = torch.randn(6, 37, 40, generator=gen)  # (b, L, C): the conv's
    w, b = torch.randn(2, 40, 4, generator=gen), torch.randn(2, 40, generator=gen)
    dact = torch.randn(6, 2, 40, 37, generator=gen)
    y, z = torch.randn(6, 2, 32, 70, generator=gen), torch.randn(6, 70, 32, generator=gen)
    nw, dm = torch.randn(2, 32, generator=gen), torch.randn(6, 70, 32, generator=gen)
    px, py = torch.randn(2, 3, 2, 2, 17, 150, generator=gen).unbind(0)
    rstd = torch.rand(6, 37, 1, generator=gen) + 0.5
    pcb = torch.randn(3, 2, 2, 150, 150, generator=gen)

    mx, mys, mrow, mdiag, mwide, mparts, mdm, mz, mnw = _scan_output_operands(torch.float32, gen)
    # the quadratic scan of both directions at three token blocks, head 0 decaying too strongly
    # to factor (the wide heads' kernels)
    qx, qdy = torch.randn(2, 3, 2, 4, 5, 150, generator=gen).unbind(0)
    qdt = torch.rand(3, 2, 4, 150, generator=gen) * .5 + .1
    qA = -torch.rand(2, 4, generator=gen) - .1
    qA[:, 0] = -300.
    qB, qC = torch.randn(2, 3, 2, 2, 6, 150, generator=gen).unbind(0)
    qD = torch.randn(2, 4, generator=gen)

    def run():
        from mmdinomamba.ops.cpu.ssd_quadratic import scan_backward, scan_forward
        dz = torch.empty(6, 70, 32)
        qy, st = scan_forward(qx, qdt, qA, qB, qC, qD)
        assert st.wide.any() and not st.wide.all()
        mdz, mout = torch.empty_like(mdm), torch.empty_like(mdm)
        dx = torch.empty(6, 37, 40)
        merged = torch.empty(6, 70, 32)
        kernels().merge_forward(y, z, nw, 2, 1e-5, merged)
        return [*kernels().scan_factors(xc[..., :8], b[:, :8].contiguous(),
                                        -w[:, :8, 0].abs() * 9, 100.),
                kernels().conv_silu_forward(xc, w, b),
                *kernels().conv_silu_backward([dact], xc, w, b, dx), dx,
                merged,
                *_merge_backward(dm, y, z, nw, 2, 1e-5, dz, None), dz,
                qy, *scan_backward(qdy, qx, qdt, qA, qB, qC, st, True),
                *kernels().merge_backward_scan(mdm, mys, mrow, mx, mdiag, mwide, mparts, mz,
                                               mnw, 2, 1e-5, mdz, mout), mdz, mout,
                _column_products(px, pcb, [0, 64, 128, 150], True, True),
                _column_products(px, pcb, [0, 64, 128, 150], False, False),
                *_masked_outer(px, py, [0, 64, 128, 150]),
                *kernels().rms_norm_forward(xc, w[0, :, 0].contiguous(), 1e-5),
                *kernels().rms_norm_backward(dx.contiguous(), xc, rstd, w[0, :, 0].contiguous())]

    for one, two in zip(_with_threads(1, run), _with_threads(2, run)):
        assert torch.equal(one, two)


def _grads(m, x):
    m.zero_grad()
    x = x.detach().requires_grad_()
    y = m(x)
    y.backward(torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y))
    return [y.detach(), x.grad] + [p.grad.clone() for p in m.parameters()]


class _Patched:
    """The compiled kernels with some functions replaced: ``replace`` maps a name to a function
    of the original that returns its replacement."""

    def __init__(self, module, replace: dict):
        self._module, self._replace = module, replace

    def __getattr__(self, name):
        fn = getattr(self._module, name)
        return self._replace[name](fn) if name in self._replace else fn


def _record(monkeypatch, names) -> list:
    """The list that the named kernels append their names to when called (from now on: after
    the self-check, which calls them too)."""
    assert native_cpu.available()
    calls = []
    replace = {n: lambda fn, n=n: lambda *a, **k: calls.append(n) or fn(*a, **k) for n in names}
    monkeypatch.setitem(native_cpu._state, 'module', _Patched(native_cpu.kernels(), replace))
    return calls


def _assert_the_reference_agrees(m, x, native, calls, atol):
    """``_grads(m, x)`` with the kernels switched off calls none of them and equals ``native``."""
    calls.clear()
    with reference_ops():
        ops = _grads(m, x)
    assert calls == []
    for a, b in zip(native, ops):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=atol)


@pytest.mark.parametrize('length', [23, 130])
def test_fast_path_uses_them_and_equals_the_reference(monkeypatch, length):
    m = BiSSD(embed_dims=32, d_state=8, headdim=8).double()
    with torch.no_grad():  # A = -1: every head factored (the next test has the others)
        m.A_log.zero_()
        m.A_log_b.zero_()
    x = torch.randn(3, length, 32, dtype=torch.float64)
    calls = _record(monkeypatch, ('conv_silu_forward', 'conv_silu_backward', 'merge_forward',
                                  'merge_backward_scan', 'column_products',
                                  'masked_outer', 'products_forward', 'products_backward'))
    native = _grads(m, x)
    # forward (the conv's output kept); the scan's output rebuilt in the backward pass inside
    # the merge's backward kernel; the factored products with their element-wise work in one
    # call each way; then dB and dC natively at several token blocks (130 tokens)
    blocks = length >= 128
    assert calls == ['conv_silu_forward', 'masked_outer', 'products_forward', 'merge_forward',
                     'merge_backward_scan', 'products_backward',
                     *['column_products'] * (2 * blocks),
                     'conv_silu_backward']
    _assert_the_reference_agrees(m, x, native, calls, atol=1e-13)


@pytest.mark.parametrize('length', [23, 130])
def test_fast_path_runs_strongly_decaying_heads_in_them(monkeypatch, length):
    m = BiSSD(embed_dims=32, d_state=8, headdim=8).double()
    with torch.no_grad():  # dt about softplus(0), A = -300: too wide to factor
        m.dt_bias.zero_()
        m.dt_b_bias.zero_()
        m.A_log.fill_(math.log(300.))
        m.A_log_b[:2].fill_(math.log(300.))
        m.A_log_b[2:].fill_(math.log(.5))
    x = torch.randn(2, length, 32, dtype=torch.float64)
    calls = _record(monkeypatch, ('wide_forward', 'wide_backward', 'column_products',
                                  'masked_outer', 'merge_backward_scan'))
    native = _grads(m, x)
    # the merge's backward pass rebuilds the scan's output, the wide heads' parts included;
    # one call each way for both directions' wide heads, their products inside; the factored
    # heads' C^T B natively, dB and dC natively at several token blocks (130 tokens)
    assert calls.count('merge_backward_scan') == 1
    assert [c for c in calls if c.startswith('wide')] == ['wide_forward', 'wide_backward']
    assert calls.count('column_products') == 2 * (length >= 128)
    assert calls.count('masked_outer') == 1
    _assert_the_reference_agrees(m, x, native, calls, atol=1e-12)


def test_torch_compile_runs_the_kernels_as_one_op(monkeypatch):
    """The compiler sees the mixer's inside as the ``mmdinomamba::bidir_ssd`` op: a compiled
    mixer (one graph) runs the kernels as eager does, and both agree."""
    m = BiSSD(embed_dims=32, d_state=8, headdim=8)
    x = torch.randn(2, 9, 32)
    calls = _record(monkeypatch, ('conv_silu_forward', 'merge_forward'))
    torch._dynamo.reset()
    compiled = torch.compile(m, backend='eager', fullgraph=True)(x)
    assert calls == ['conv_silu_forward', 'merge_forward']
    eager = m(x)
    assert calls == ['conv_silu_forward', 'merge_forward'] * 2
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)


def test_switched_off_by_the_switch(monkeypatch):
    with reference_ops():
        assert not native_cpu.available()
    assert native_cpu.available()
    monkeypatch.setattr(switch, '_ENV_OFF', True)  # as MMDINOMAMBA_KERNELS=0 at import
    assert not native_cpu.available()


def test_the_build_is_keyed_by_source_path_and_contents(monkeypatch, tmp_path):
    # two checkouts or versions sharing one extension cache keep separate builds
    # building leaves the key as it was (the flags it is made of are not appended to): a second
    # build in this process, or the next process, finds this one
    assert native_cpu.load().__name__ == f'mmdinomamba_cpu_{native_cpu._build_key()}'
    key = native_cpu._build_key()
    assert key == native_cpu._build_key()
    for source in native_cpu.CSRC.iterdir():
        (tmp_path / source.name).write_bytes(source.read_bytes())
    monkeypatch.setattr(native_cpu, 'CSRC', tmp_path)
    moved = native_cpu._build_key()
    copy = tmp_path / 'common.h'
    copy.write_bytes(copy.read_bytes() + b'// changed\n')
    assert len({key, moved, native_cpu._build_key()}) == 3


def test_a_backward_pass_runs_what_its_forward_chose(monkeypatch):
    # switched off between forward and backward: the backward pass still uses the kernels
    m = BiSSD(embed_dims=32, d_state=8, headdim=8).double()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    want = _grads(m, x)
    m.zero_grad()
    xl = x.clone().requires_grad_()
    y = m(xl)
    with reference_ops():
        y.backward(torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y))
    for a, b in zip([y.detach(), xl.grad] + [p.grad for p in m.parameters()], want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def _rebuilt_with(monkeypatch, replace: dict) -> None:
    """The next load "builds" the kernels with ``replace`` (:class:`_Patched`) and checks them
    again."""
    module = native_cpu.kernels()
    monkeypatch.setattr(native_cpu, '_state', {})
    monkeypatch.setattr(native_cpu, '_build', lambda: (_Patched(module, replace), None))


@pytest.mark.parametrize('broken', ['conv_silu_backward', 'merge_forward', 'wide_forward',
                                    'wide_backward', 'products_forward', 'products_backward',
                                    'chunk_scan_backward', 'merge_backward_scan',
                                    'scan_factors'])
def test_kernels_that_fail_their_self_check_are_not_used(monkeypatch, broken):
    # a kernel 1% off (as a miscompiled one might be): one warning, the reference runs
    def off(fn):
        def run(*args, **kwargs):
            out = fn(*args, **kwargs)
            # merge_forward writes into its out; wide_backward's dA is near zero there: the
            # dx it added to
            if broken in ('merge_forward', 'wide_backward'):
                first = args[-1] if broken == 'merge_forward' else args[7]
            else:
                first = out if torch.is_tensor(out) else out[0]
            first.mul_(1.01)
            return out
        return run

    _rebuilt_with(monkeypatch, {broken: off})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        assert not native_cpu.available()
        assert not native_cpu.available()
    assert len(caught) == 1 and 'failed their self-check' in str(caught[0].message)
    assert 'relative error' in native_cpu.load_error()
    m = BiSSD(embed_dims=32, d_state=8, headdim=8)
    assert torch.isfinite(m(torch.randn(2, 9, 32))).all()  # the reference runs instead


def test_a_self_check_that_raises_fails(monkeypatch):
    def rejects(fn):
        def run(*args, **kwargs):
            raise RuntimeError('native merge: z must be a (b, L, d) tensor')
        return run

    _rebuilt_with(monkeypatch, {'merge_backward_scan': rejects})
    with pytest.warns(UserWarning, match='failed their self-check'):
        assert not native_cpu.available()
    assert native_cpu.load_error().startswith('RuntimeError: native merge')


def test_a_failed_build_falls_back_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(native_cpu, '_state', {})
    monkeypatch.setattr(native_cpu, 'SOURCES', (tmp_path / 'missing.cpp', ))
    monkeypatch.setattr(native_cpu, 'CSRC', tmp_path)
    monkeypatch.setenv('TORCH_EXTENSIONS_DIR', str(tmp_path / 'cache'))  # not the user's cache
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        assert not native_cpu.available()
        assert not native_cpu.available()  # tried once, warned once
    assert len(caught) == 1 and 'could not be built' in str(caught[0].message)
    assert 'missing.cpp' in native_cpu.load_error()
    m = BiSSD(embed_dims=32, d_state=8, headdim=8)
    y = m(torch.randn(2, 9, 32))  # the reference runs instead
    assert torch.isfinite(y).all()


def test_sanitizer_plugin_refuses_a_process_without_asan():
    """``make sanitize``'s plugin stops with a clear error, and leaves the build flags alone,
    when AddressSanitizer is not loaded (a run that would only look sanitized)."""
    plugin = pytest.importorskip('asan_native')
    if plugin._asan_loaded():
        pytest.skip('running under make sanitize')
    flags = native_cpu.CFLAGS
    with pytest.raises(pytest.UsageError, match='make sanitize'):
        plugin.pytest_configure(None)
    assert native_cpu.CFLAGS == flags and not any('sanitize' in f for f in native_cpu.LDFLAGS)
