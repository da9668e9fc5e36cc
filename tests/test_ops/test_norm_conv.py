"""Gated RMSNorm and the depthwise causal conv against direct computations."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmdinomamba.ops import RMSNorm, causal_conv1d, gated_rms_norm, rms_norm


def _rms(v, eps):
    return v / torch.sqrt((v * v).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize('norm_before_gate', [False, True])
@pytest.mark.parametrize('group_size', [None, 4])
def test_gated_rms_norm_matches_formula(norm_before_gate, group_size):
    x, z, w = torch.randn(2, 5, 12), torch.randn(2, 5, 12), torch.randn(12)
    out = gated_rms_norm(
        x, z, w, eps=1e-5, group_size=group_size, norm_before_gate=norm_before_gate)
    gs = group_size or 12
    gate = z * torch.sigmoid(z)
    v = x if norm_before_gate else x * gate
    want = torch.cat([_rms(v[..., i:i + gs], 1e-5) for i in range(0, 12, gs)], -1) * w
    if norm_before_gate:
        want = want * gate
    torch.testing.assert_close(out, want)


def test_gated_rms_norm_without_gate_and_in_bf16():
    x, w = torch.randn(3, 8), torch.rand(8)
    torch.testing.assert_close(gated_rms_norm(x, None, w), _rms(x, 1e-5) * w)
    out = gated_rms_norm(x.bfloat16(), x.bfloat16(), w)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), gated_rms_norm(x, x, w), rtol=2e-2, atol=2e-2)


def test_gated_rms_norm_errors():
    with pytest.raises(ValueError, match='group_size'):
        gated_rms_norm(torch.randn(2, 10), None, torch.ones(10), group_size=4)
    with pytest.raises(ValueError, match='weight must be'):
        gated_rms_norm(torch.randn(2, 10), None, torch.ones(9))


@pytest.mark.parametrize('activation', ['silu', None])
def test_causal_conv_matches_conv1d_and_loop(activation):
    b, length, ch, k = 2, 9, 6, 4
    x = torch.randn(b, length, ch)
    conv = nn.Conv1d(ch, ch, k, groups=ch, padding=k - 1)
    out = causal_conv1d(x, conv.weight[:, 0], conv.bias, activation=activation)
    want = conv(x.transpose(1, 2))[..., :length].transpose(1, 2)
    loop = torch.stack([
        conv.bias + sum(conv.weight[:, 0, k - 1 - s] * x[:, t - s] for s in range(min(k, t + 1)))
        for t in range(length)
    ],
                       dim=1)
    if activation == 'silu':
        want, loop = F.silu(want), F.silu(loop)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(out, loop)


def test_causal_conv_is_causal_and_errors():
    x = torch.randn(1, 10, 3)
    w = torch.randn(3, 4)
    y = causal_conv1d(x, w, None, activation=None)
    x2 = x.clone()
    x2[:, 6] += 1.0
    y2 = causal_conv1d(x2, w, None, activation=None)
    assert torch.equal(y[:, :6], y2[:, :6]) and not torch.equal(y[:, 6:], y2[:, 6:])
    with pytest.raises(ValueError, match='activation'):
        causal_conv1d(x, w, activation='relu')
    with pytest.raises(ValueError, match='weight'):
        causal_conv1d(x, torch.randn(4, 4))


def _formula(x, z, w, eps, gs, norm_before_gate):
    """The gated RMSNorm written out directly (differentiated by autograd)."""
    gate = None if z is None else z * torch.sigmoid(z)
    v = x if gate is None or norm_before_gate else x * gate
    out = torch.cat([_rms(v[..., i:i + gs], eps) for i in range(0, x.shape[-1], gs)], -1) * w
    return out * gate if gate is not None and norm_before_gate else out


@pytest.mark.parametrize('norm_before_gate', [False, True])
@pytest.mark.parametrize('group_size,with_gate', [(12, True), (4, True), (4, False)])
def test_gated_rms_norm_gradients_match_autograd_of_formula(norm_before_gate, group_size,
                                                             with_gate):
    x, z, w = (torch.randn(2, 5, 12, dtype=torch.float64), torch.randn(2, 5, 12,
                                                                     dtype=torch.float64),
               torch.randn(12, dtype=torch.float64))
    z = z if with_gate else None
    leaves = [t.requires_grad_() for t in (x, z, w) if t is not None]
    go = torch.randn(2, 5, 12, dtype=torch.float64)
    got = torch.autograd.grad(
        gated_rms_norm(x, z, w, 1e-5, group_size, norm_before_gate), leaves, go)
    want = torch.autograd.grad(_formula(x, z, w, 1e-5, group_size, norm_before_gate), leaves, go)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


def test_gated_rms_norm_keeps_only_its_inputs_for_backward():
    from torch.autograd.graph import saved_tensors_hooks
    x, z = torch.randn(2, 64, 32, requires_grad=True), torch.randn(2, 64, 32, requires_grad=True)
    w = torch.ones(32, requires_grad=True)
    saved = []
    with saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        gated_rms_norm(x, z, w, group_size=8)
    assert sum(t.numel() for t in saved) <= x.numel() + z.numel() + w.numel()


def test_gated_rms_norm_bf16_gradients_close_to_float32():
    x, z, w = torch.randn(4, 16), torch.randn(4, 16), torch.rand(16) + 0.5
    grads = []
    for dtype in (torch.float32, torch.bfloat16):
        xs, zs = (t.detach().to(dtype).requires_grad_() for t in (x, z))
        ws = w.clone().requires_grad_()
        gated_rms_norm(xs, zs, ws).float().square().sum().backward()
        assert xs.grad.dtype == dtype and zs.grad.dtype == dtype and ws.grad.dtype == w.dtype
        grads.append([xs.grad.float(), zs.grad.float(), ws.grad])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize('key', ['norm', 'conv'])
def test_a_library_kernel_that_fails_at_run_time_raises(kernels_as_on_cuda, key):
    """mamba_ssm's rmsnorm_fn / causal_conv1d_fn raising at run time: the error reaches the
    caller (no silent fallback) and the kernel stays in use."""
    from mmdinomamba.ops.cuda import _triton
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError('no kernel image for this GPU')

    x, z, w, k = torch.randn(1, 6, 8), torch.randn(1, 6, 8), torch.randn(8), torch.randn(8, 4)

    def op():
        return gated_rms_norm(x, z, w, group_size=4) if key == 'norm' else causal_conv1d(x, k)

    kernels_as_on_cuda(**{key: broken})
    for _ in range(2):
        with pytest.raises(RuntimeError, match='no kernel image'):
            op()
    assert calls == [1, 1] and _triton._cache[key] is broken


def _rms_grads(fn, x, w, g):
    x = x.detach().requires_grad_()
    w = None if w is None else w.detach().requires_grad_()
    y = fn(x, w)
    y.backward(g)
    return [y.detach(), x.grad, None if w is None else w.grad]


@pytest.mark.parametrize('dtype,tol', [(torch.float64, 1e-13), (torch.float32, 1e-6)])
@pytest.mark.parametrize('with_weight', [True, False])
@pytest.mark.parametrize('shape', [(3, 7, 5), (2, 197, 256), (40, 64)])
def test_rms_norm_equals_pytorchs(dtype, tol, with_weight, shape):
    # the native CPU forward and backward against F.rms_norm's autograd; 197 x 2 rows: the
    # weight's gradient summed over several chunks of rows; the input a transposed view, the
    # weight a strided one
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*shape[:-2], shape[-1], shape[-2], generator=gen, dtype=dtype).mT
    w = torch.randn(shape[-1], 2, generator=gen, dtype=dtype)[:, 0] if with_weight else None
    g = torch.randn(shape, generator=gen, dtype=dtype)
    got = _rms_grads(lambda a, b: rms_norm(a, b, 1e-5), x, w, g)
    want = _rms_grads(lambda a, b: F.rms_norm(a, shape[-1:], b, 1e-5), x, w, g)
    for a, b in zip(got, want):
        if b is None:
            assert a is None
        else:
            torch.testing.assert_close(a, b, rtol=tol, atol=tol * b.abs().max().item())


def test_rms_norm_runs_natively_on_cpu_and_falls_back_elsewhere(monkeypatch):
    from test_native_cpu import _record

    from mmdinomamba.ops import reference_ops
    calls = _record(monkeypatch, ('rms_norm_forward', 'rms_norm_backward'))
    x, w, g = torch.randn(4, 9, 16), torch.randn(16), torch.randn(4, 9, 16)
    native = _rms_grads(lambda a, b: rms_norm(a, b, 1e-6), x, w, g)
    assert calls == ['rms_norm_forward', 'rms_norm_backward']
    calls.clear()
    # bfloat16, autocast and the switched-off kernels take F.rms_norm, with its results
    _rms_grads(lambda a, b: rms_norm(a, b, 1e-6), x.bfloat16(), w.bfloat16(), g.bfloat16())
    with torch.autocast('cpu', dtype=torch.bfloat16):
        rms_norm(x, w, 1e-6)
    with reference_ops():
        ops = _rms_grads(lambda a, b: rms_norm(a, b, 1e-6), x, w, g)
    assert calls == []
    for a, b in zip(native, ops):
        torch.testing.assert_close(a, b)


def test_rms_norm_module_is_a_drop_in_for_torchs():
    ours, theirs = RMSNorm(16, eps=1e-5), nn.RMSNorm(16, eps=1e-5)
    nn.init.normal_(theirs.weight)
    ours.load_state_dict(theirs.state_dict())
    assert isinstance(ours, nn.RMSNorm) and ours.state_dict().keys() == {'weight'}
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(ours(x), theirs(x))
    assert RMSNorm(16, elementwise_affine=False)(x).shape == x.shape
    with pytest.raises(ValueError, match='expected inputs of 16 channels'):
        ours(torch.randn(2, 16, 5))
    with pytest.raises(ValueError, match='normalized_shape must be an int'):
        RMSNorm([4, 16])


def test_native_rms_norm_bad_input_is_named():
    from mmdinomamba.ops.cpu.native_cpu import kernels
    x = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match='x must be a contiguous float32 or float64'):
        kernels().rms_norm_forward(x.mT, None, 1e-5)
    with pytest.raises(RuntimeError, match='weight must be a contiguous \\(8,\\) tensor'):
        kernels().rms_norm_forward(x, torch.randn(7), 1e-5)
    y, rstd = kernels().rms_norm_forward(x, None, 1e-5)
    with pytest.raises(RuntimeError, match='rstd must hold one value of x\'s dtype per row'):
        kernels().rms_norm_backward(x, x, rstd[:3], None)
