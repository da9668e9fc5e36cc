"""Optional-kernel loading (``ops/cuda/_triton.py``) and the Triton path on a GPU (``gpu``
marker)."""
import importlib
import sys
import textwrap
import warnings

import pytest
import torch

from mmdinomamba.ops import ssd_scan, ssd_scan_chunked
from mmdinomamba.ops.cuda import _triton


@pytest.fixture
def fresh_kernel_cache(monkeypatch):
    monkeypatch.setattr(_triton, '_cache', {})
    monkeypatch.setattr(_triton, '_logged', set())
    saved = {k: v for k, v in sys.modules.items() if k.split('.')[0] == 'mamba_ssm'}
    yield
    for k in [k for k in sys.modules if k.split('.')[0] == 'mamba_ssm']:
        del sys.modules[k]
    sys.modules.update(saved)


def test_missing_mamba_ssm_degrades_to_none(fresh_kernel_cache, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None
                        if name == 'mamba_ssm' else real_find_spec(name, *a))
    with pytest.warns(UserWarning, match='SSD scan: .* unavailable .*mamba_ssm is not installed'):
        assert _triton.chunk_scan_fn() is None
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        assert _triton.chunk_scan_fn() is None  # decided once: no second warning


def test_first_lookup_inside_a_cuda_graph_capture_raises(fresh_kernel_cache, monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'is_current_stream_capturing', lambda: True)
    with pytest.raises(RuntimeError, match='inside a CUDA graph capture'):
        _triton.chunk_scan_fn()
    assert 'scan' not in _triton._cache


def test_broken_package_init_is_bypassed(fresh_kernel_cache, monkeypatch, tmp_path):
    """mamba_ssm 2.3.2.post1 without CUDA: its __init__ fails, the kernel files import."""
    pkg = tmp_path / 'mamba_ssm'
    (pkg / 'ops' / 'triton').mkdir(parents=True)
    (pkg / '__init__.py').write_text('import selective_scan_cuda_missing_module\n')
    (pkg / 'ops' / '__init__.py').write_text('')
    (pkg / 'ops' / 'triton' / '__init__.py').write_text('')
    (pkg / 'ops' / 'triton' / 'ssd_combined.py').write_text(
        textwrap.dedent("""
        from mamba_ssm.ops.triton import helper
        def mamba_chunk_scan_combined(*args, **kwargs):
            return helper.MARK
    """))
    (pkg / 'ops' / 'triton' / 'helper.py').write_text('MARK = "kernel"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    for k in [k for k in sys.modules if k.split('.')[0] == 'mamba_ssm']:
        del sys.modules[k]
    monkeypatch.setitem(sys.modules, 'triton', sys.modules.get('triton') or object())
    fn = _triton.chunk_scan_fn()
    assert fn is not None and fn() == 'kernel'
    assert sys.modules['mamba_ssm'].__doc__.startswith('bare package')


@pytest.mark.gpu
def test_triton_scan_matches_portable_in_bf16():
    """Triton vs portable on CUDA: error vs float64 at most ~2x plain PyTorch in bf16."""
    if _triton.chunk_scan_fn() is None:
        pytest.skip('mamba_ssm Triton kernels not importable')
    gen = torch.Generator().manual_seed(0)
    b, length, h, p, g, n = 2, 1024, 8, 64, 2, 64
    shapes = ((b, length, h, p), (b, length, h), (b, length, g, n), (b, length, g, n))
    x, dt, B, C = (torch.randn(*s, generator=gen).cuda() for s in shapes)
    dt = torch.nn.functional.softplus(dt - 3)  # dt around 0.05: realistic for 256-token chunks
    A = -torch.linspace(1, 16, h, device='cuda')
    D = torch.randn(h, generator=gen).cuda()
    exact = [t.double().requires_grad_() for t in (x, dt, A, B, C, D)]
    bf16 = [
        t.bfloat16().requires_grad_() if i not in (2, 5) else t.float().requires_grad_()
        for i, t in enumerate((x, dt, A, B, C, D))
    ]
    plain = [t.detach().clone().requires_grad_() for t in bf16]
    dy = torch.randn_like(x)
    y64 = ssd_scan_chunked(*exact)
    y64.backward(dy.double())
    y_tri = ssd_scan(*bf16, chunk_size=256, backend='triton')
    y_tri.float().backward(dy)
    y_pt = ssd_scan_chunked(*plain, chunk_size=64, upcast=False)
    y_pt.float().backward(dy)

    def err(a, b):
        return ((a.double() - b).norm() / b.norm()).item()

    assert err(y_tri, y64) <= 2 * err(y_pt, y64) + 1e-3
    for a, p, e in zip(bf16, plain, exact):
        assert err(a.grad, e.grad) <= 2 * err(p.grad, e.grad) + 1e-3


def test_kernel_failure_at_run_time_is_raised(fresh_kernel_cache, kernels_as_on_cuda):
    """No silent fallback: an error inside a kernel (an out-of-memory, a failed CUDA-graph
    capture) reaches the caller, and the kernel stays in use."""
    def broken(*args, **kwargs):
        raise RuntimeError('triton compile error')

    args = [
        torch.randn(1, 9, 2, 4),
        torch.rand(1, 9, 2), -torch.rand(2),
        torch.randn(1, 9, 1, 3),
        torch.randn(1, 9, 1, 3), None
    ]
    kernels_as_on_cuda(scan=broken)
    with pytest.raises(RuntimeError, match='triton compile error'):
        ssd_scan(*args)
    assert _triton._cache['scan'] is broken


def test_reference_ops_context_hides_every_kernel(monkeypatch):
    from mmdinomamba.ops import reference_ops
    sentinel = object()
    monkeypatch.setitem(_triton._cache, 'scan', sentinel)
    monkeypatch.setitem(_triton._cache, 'norm', sentinel)
    monkeypatch.setitem(_triton._cache, 'conv', sentinel)
    assert _triton.chunk_scan_fn() is sentinel
    with reference_ops():
        with reference_ops():  # nests
            assert _triton.chunk_scan_fn() is None
        assert _triton.rmsnorm_fn() is None and _triton.causal_conv1d_fn() is None
    assert _triton.rmsnorm_fn() is sentinel


@pytest.mark.parametrize('use_reentrant', [False, True])
def test_self_check_inside_an_activation_checkpoint(use_reentrant):
    """A kernel's first call, and so its self-check, can come from inside an activation
    checkpoint (BiSSD's recomputed merge, ``with_cp``): the check must neither hand its own
    saved tensors to the checkpoint nor return a graph, or the checkpoint's backward fails
    (different numbers of tensors saved in forward and recomputation)."""
    checked = []

    def region(a, b):
        if not checked:  # as a kernel lookup: once, on the first (forward) call
            _triton.compare_with_reference('test', lambda p, q: (p * q).sin(),
                                           lambda p, q: torch.sin(q * p),
                                           [a.detach(), b.detach()], torch.ones(5),
                                           ('y', 'da', 'db'), 1e-6)
            checked.append(True)
        return (a * b).sin() * a

    a, b = torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)
    region(a, b).square().sum().backward()
    want = a.grad.clone(), b.grad.clone()
    a.grad = b.grad = None
    checked.clear()
    torch.utils.checkpoint.checkpoint(region, a, b,
                                      use_reentrant=use_reentrant).square().sum().backward()
    assert checked
    torch.testing.assert_close((a.grad, b.grad), want)
