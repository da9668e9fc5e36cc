"""BiSSD: both directions used, mixing matrices exact, official parameter names and counts."""
import contextlib
import importlib.util
import textwrap

import pytest
import torch
import torch.nn.functional as F
from mmpretrain.registry import MODELS

from mmdinomamba.models.mixers import BiSSD
from mmdinomamba.ops import reference_ops, ssd_mixing_matrix, ssd_scan

DIM, L = 32, 23
TINY = dict(embed_dims=DIM, d_state=8, headdim=8, chunk_size=16)
OFFICIAL_KEYS = {
    'in_proj.weight', 'conv1d.weight', 'conv1d.bias', 'conv1d_b.weight', 'conv1d_b.bias', 'dt_bias',
    'dt_b_bias', 'A_log', 'A_log_b', 'D', 'D_b', 'norm.weight', 'norm_b.weight', 'out_proj.weight'
}


def _mixer(**kw):
    torch.manual_seed(0)
    return BiSSD(**{**TINY, **kw}).double()


def _apply(M, v):
    """(B, h, L, L) @ (B, L, h, p) per head -> (B, L, h, p)."""
    return torch.einsum('bhij,bjhp->bihp', M, v)


def test_build_from_registry_shapes_and_keys():
    m = MODELS.build(dict(type='BiSSD', **TINY))
    x = torch.randn(2, L, DIM)
    assert m(x, hw=(1, L)).shape == x.shape
    assert m.num_heads == 2 * DIM // 8
    assert set(m.state_dict()) == OFFICIAL_KEYS


def test_init_follows_mamba2():
    m = BiSSD(256)
    for dt_bias in (m.dt_bias, m.dt_b_bias):
        dt = F.softplus(dt_bias)
        assert dt.min() >= 1e-4 - 1e-9 and dt.max() <= 0.1 + 1e-6
    for a_log in (m.A_log, m.A_log_b):
        assert a_log.exp().min() >= 1 and a_log.exp().max() <= 16
    assert torch.equal(m.D, torch.ones(8)) and torch.equal(m.D_b, torch.ones(8))
    assert m.conv1d.weight.shape == (512 + 128, 1, 4) and m.in_proj.bias is None


@pytest.mark.parametrize('d_model,expected_layer,expected_total', [(256, 435504, 10.71e6),
                                                                   (512, 1660256, 40.35e6),
                                                                   (768, 3675536, 88.97e6)])
def test_parameter_count_matches_official_formula(d_model, expected_layer, expected_total):
    d_inner, n, h, k = 2 * d_model, 64, 2 * d_model // 64, 4
    conv_dim = d_inner + 2 * n
    formula = (
        d_model * (2 * d_inner + 2 * n + h) + 2 * (conv_dim * k + conv_dim) + 6 * h + 2 * d_inner +
        d_inner * d_model)
    count = sum(p.numel() for p in BiSSD(d_model).parameters())
    assert count == formula == expected_layer
    # DinoVim: 24 x (mixer + RMSNorm) + patch embed + pos embed (197) + cls + final norm
    trunk = 3 * 16 * 16 * d_model + d_model + 197 * d_model + d_model + d_model
    assert abs(24 * (count + d_model) + trunk - expected_total) < 0.005e6


def test_mixing_matrices_reproduce_each_direction():
    m = _mixer()
    x = torch.randn(2, L, DIM, dtype=torch.float64)
    mats = m.mixing_matrices(x)
    h = m.num_heads
    y = ssd_scan(*m._scan_inputs(*m._project(x)[1:]))
    torch.testing.assert_close(_apply(mats['forward'], mats['value_forward']), y[:, :, :h])
    torch.testing.assert_close(
        _apply(mats['backward'], mats['value_backward']), y[:, :, h:].flip(1))
    assert torch.all(mats['forward'].triu(1) == 0) and torch.all(mats['backward'].tril(-1) == 0)
    _, dt, A, Bm, Cm, D = m._scan_inputs(*m._project(x)[1:])
    g = m.ngroups
    want = ssd_mixing_matrix(dt[:, :, :h], A[:h], Bm[:, :, :g], Cm[:, :, :g])
    torch.testing.assert_close(mats['forward'], want + torch.diag_embed(D[:h, None].expand(h, L)))
    combined = m.mixing_matrix(x)
    torch.testing.assert_close(combined, (mats['forward'] + mats['backward']) / 2)


def test_forward_without_norm_is_out_proj_of_mixing():
    m = _mixer(rmsnorm=False)
    x = torch.randn(2, L, DIM, dtype=torch.float64)
    mats = m.mixing_matrices(x)
    y = (_apply(mats['forward'], mats['value_forward']) +
         _apply(mats['backward'], mats['value_backward'])) / 2
    want = m.out_proj(y.flatten(2) * F.silu(mats['gate']))
    torch.testing.assert_close(m(x), want)


def test_combined_matrix_is_exact_when_both_directions_see_the_same_values():
    """With pointwise convs (only the current-token tap) v_fwd == v_bwd, so M @ v is exact."""
    m = _mixer(rmsnorm=False)
    with torch.no_grad():
        m.conv1d.weight[..., :-1] = 0
        m.conv1d_b.weight.copy_(m.conv1d.weight)
        m.conv1d_b.bias.copy_(m.conv1d.bias)
    x = torch.randn(2, L, DIM, dtype=torch.float64)
    mats = m.mixing_matrices(x)
    torch.testing.assert_close(mats['value_forward'], mats['value_backward'])
    want = m.out_proj(
        _apply(m.mixing_matrix(x), mats['value_forward']).flatten(2) * F.silu(mats['gate']))
    torch.testing.assert_close(m(x), want)


def test_both_directions_are_used():
    m = _mixer()
    x = torch.randn(1, L, DIM, dtype=torch.float64)
    y = m(x)
    late, early = x.clone(), x.clone()
    late[:, -1] += 1.0  # reaches token 0 only through the backward direction
    early[:, 0] += 1.0  # reaches the last token only through the forward direction
    assert (m(late) - y)[:, 0].abs().max() > 1e-6
    assert (m(early) - y)[:, -1].abs().max() > 1e-6
    with torch.no_grad():  # silencing the backward direction changes the output
        m.conv1d_b.weight.zero_()
        m.conv1d_b.bias.zero_()
    assert (m(x) - y).abs().max() > 1e-6


def test_gradients_reach_every_parameter():
    m = BiSSD(**TINY)
    x = torch.randn(2, L, DIM, requires_grad=True)
    m(x).square().sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    assert torch.isfinite(x.grad).all()


def test_portable_backend_matches_reference_backend():
    m = _mixer()
    x = torch.randn(2, 70, DIM, dtype=torch.float64)
    y = m(x)
    m.backend = 'ref'
    torch.testing.assert_close(m(x), y, rtol=1e-10, atol=1e-10)


def test_strong_decay_gives_the_reference_result():
    """Every head decaying too strongly to factor (the quadratic form's per-head work): the
    output still equals the reference recurrence."""
    m = _mixer()
    x = torch.randn(2, 120, DIM, dtype=torch.float64)
    with torch.no_grad():
        m.A_log.fill_(8.0)  # A = -e^8: every head's decay range far above FACTORED_RANGE
        m.A_log_b.fill_(8.0)
    y = m(x)
    m.backend = 'ref'
    torch.testing.assert_close(y, m(x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('kw,match', [(dict(headdim=7), 'divisible by headdim'),
                                      (dict(num_heads=3), 'num_heads=3'),
                                      (dict(ngroups=3), 'ngroups')])
def test_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        BiSSD(**{**TINY, **kw})


@pytest.mark.gpu
def test_cuda_mixer_matches_portable():
    """The CUDA path (Triton scan, fused kernels when installed) vs the portable path.

    Float32 inputs; Triton's fp32 matmuls may use TF32, hence the 1e-2 tolerances."""
    m = BiSSD(**TINY).cuda()
    x = torch.randn(2, 197, DIM, device='cuda')
    results = []
    for backend in ('auto', 'torch'):
        m.backend = backend
        m.zero_grad()
        y = m(x)
        y.square().sum().backward()
        results.append((y.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-2, atol=1e-2)
    for name, grad in results[0][1].items():
        err = (grad - results[1][1][name]).norm() / results[1][1][name].norm()
        assert err < 1e-2, name


@pytest.mark.parametrize('device', ['cpu', pytest.param('cuda', marks=pytest.mark.gpu)])
@pytest.mark.parametrize('rmsnorm,recompute_merge', [(True, False), (False, False),
                                                     (True, True)])
def test_kernels_equal_the_reference(device, rmsnorm, recompute_merge):
    """The kernels (CPU: the ``mmdinomamba::bidir_ssd`` op; CUDA: our fused conv and merge
    around ``mamba_ssm``'s scan) vs the reference, whole mixer with gradients."""
    m = BiSSD(64, d_state=16, headdim=16, rmsnorm=rmsnorm,
              recompute_merge=recompute_merge).to(device)
    x = torch.randn(2, 37, 64, device=device)
    res = []
    for kernels in (True, False):
        m.zero_grad()
        with contextlib.nullcontext() if kernels else reference_ops():
            y = m(x)
        y.square().mean().backward()
        res.append([y.detach()] + [p.grad.clone() for p in m.parameters()])
    for a, b in zip(*res):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


_FUSED_MIXER_INTERPRETED = textwrap.dedent('''
    import contextlib
    import torch
    import kernel_interpreter
    from mmdinomamba.models.mixers import BiSSD
    from mmdinomamba.ops import reference_ops
    print('KERNELS', kernel_interpreter.route(mamba=False))
    calls = kernel_interpreter.count_calls('bidir_conv', 'bidir_merge')
    torch.manual_seed(0)
    worst = 0.
    for rmsnorm, ngroups in ((True, 1), (True, 2), (False, 1)):
        # the second mixer recomputes its merged output in the backward pass
        m = BiSSD(64, d_state=16, headdim=16, ngroups=ngroups, rmsnorm=rmsnorm,
                  recompute_merge=ngroups == 2)
        x = torch.randn(2, 23, 64)
        res = []
        for fused in (True, False):
            m.zero_grad()
            with contextlib.nullcontext() if fused else reference_ops():
                y = m(x)
                y.square().mean().backward()
            res.append([y.detach()] + [p.grad.clone() for p in m.parameters()])
        for a, b in zip(*res):
            worst = max(worst, ((a - b).norm() / b.norm()).item())
    print('CALLS', sorted(set(calls)), len(calls))
    print('WORST', worst)
''')


def test_mixer_through_both_fused_kernels_matches_portable(run_interpreted):
    """The whole mixer (forward and every parameter gradient) through our fused conv and merge
    kernels (Triton's CPU interpreter; the dispatch routed as on CUDA; portable scan and norm)
    vs the portable ops."""
    out = run_interpreted(_FUSED_MIXER_INTERPRETED)
    assert "KERNELS ['bidir_conv', 'bidir_merge']" in out, out
    # 3 mixers with fused=True: the conv once each, the merge once (kept for out_proj) and
    # twice in the mixer that recomputes it in backward
    assert "CALLS ['bidir_conv', 'bidir_merge'] 7" in out, out
    assert float(out.split('WORST')[-1]) < 1e-5


_LAZY_MERGE_INTERPRETED = textwrap.dedent('''
    import contextlib
    import torch
    import kernel_interpreter
    from mmdinomamba.models.mixers import BiSSD
    from mmdinomamba.ops import reference_ops
    from mmdinomamba.ops.cuda import _triton
    # as on a GPU: the merge kernel is looked up (and self-checked) at its first call, which
    # comes from inside the activation checkpoint of the recomputed merge
    kernel_interpreter.route_lazily(mamba=False)
    torch.manual_seed(0)
    m = BiSSD(64, d_state=16, headdim=16, recompute_merge=True)
    x = torch.randn(2, 19, 64)
    res = []
    for portable in (False, True):
        m.zero_grad()
        with reference_ops() if portable else contextlib.nullcontext():
            y = m(x)
            y.square().mean().backward()
        res.append([y.detach()] + [p.grad.clone() for p in m.parameters()])
    print('MERGE', _triton._cache.get('bidir_merge') is not None)
    print('WORST', max(((a - b).norm() / b.norm()).item() for a, b in zip(*res)))
''')


def test_merge_kernel_first_called_inside_the_recomputed_merge(run_interpreted):
    """The merge kernel's first call, and so its self-check, comes from inside the activation
    checkpoint of the recomputed merge in a training step (as on a GPU): the kernel passes its
    check and stays in use, and the step equals the portable path (Triton's CPU interpreter)."""
    out = run_interpreted(_LAZY_MERGE_INTERPRETED)
    assert 'MERGE True' in out, out
    assert float(out.split('WORST')[-1]) < 1e-5


_RECOMPUTE_INTERPRETED = textwrap.dedent('''
    import contextlib

    import torch
    import kernel_interpreter
    from mmdinomamba.models.mixers import BiSSD
    from mmdinomamba.ops import reference_ops
    from repo_files import load_file
    print('KERNELS', kernel_interpreter.route())
    saved_bytes = load_file('tools/gpu/saved_activations.py').saved_bytes

    torch.manual_seed(0)
    m = BiSSD(64, d_state=16, headdim=16, chunk_size=16)
    x = torch.randn(1, 21, 64, requires_grad=True)
    res, mem = [], {}
    for mode in ('recompute', 'portable'):
        m.zero_grad()
        x.grad = None
        out = {}
        with reference_ops() if mode == 'portable' else contextlib.nullcontext():
            mem[mode] = saved_bytes(lambda: out.update(y=m(x)))
            out['y'].square().mean().backward()
        y = out['y']
        res.append([y.detach(), x.grad.clone()] + [p.grad.clone() for p in m.parameters()])
    print('WORST', max(((a - b).norm() / b.norm()).item() for a, b in zip(*res)))
    conv_bytes = 21 * 2 * (128 + 2 * 16) * 4  # (B, L, 2 * (d_inner + 2 * d_state)) float32
    print('SAVED', mem['portable'] - mem['recompute'], conv_bytes)
''')


def test_conv_recomputation_keeps_less_and_computes_the_same(run_interpreted):
    """The kernel path with the conv recomputed in backward (mamba_ssm's scan and our conv
    kernel in one autograd function, Triton's CPU interpreter) vs the reference (which keeps
    the conv output): same output and gradients; autograd keeps at least the conv output's
    bytes less."""
    if importlib.util.find_spec('mamba_ssm') is None:
        pytest.skip('needs mamba_ssm (installed by tools/setup_env.sh)')
    out = run_interpreted(_RECOMPUTE_INTERPRETED)
    assert "'conv_scan'" in out.split('KERNELS')[-1].splitlines()[0], out
    assert float(out.split('WORST')[-1].split()[0]) < 1e-5
    less, conv_bytes = map(int, out.split('SAVED')[-1].split())
    assert less >= conv_bytes, (less, conv_bytes)


def test_each_direction_is_exact_against_the_forward_pass(monkeypatch):
    """``M_dir @ value_dir`` equals the scan output that ``forward`` itself feeds into the gated
    norms (captured at the merge of the reference), per direction; the public API needs no
    private method."""
    from mmdinomamba.ops.reference import mixer
    m = _mixer()
    x = torch.randn(2, L, DIM, dtype=torch.float64)
    seen = {}
    merge = mixer.bidir_gated_merge_ref

    def capture(y, z, *args):
        seen['y'], seen['z'] = y, z
        return merge(y, z, *args)

    monkeypatch.setattr(mixer, 'bidir_gated_merge_ref', capture)
    with reference_ops():
        out = m(x)
    mats = m.mixing_matrices(x)
    h, p = m.num_heads, m.headdim
    y = seen['y'].reshape(2, L, 2 * h, p)  # backward heads in flipped token order
    torch.testing.assert_close(_apply(mats['forward'], mats['value_forward']), y[:, :, :h],
                               rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(_apply(mats['backward'], mats['value_backward']),
                               y[:, :, h:].flip(1), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(mats['gate'], seen['z'])
    # ... and the documented composition gives the output
    y_f = _apply(mats['forward'], mats['value_forward']).flatten(2)
    y_b = _apply(mats['backward'], mats['value_backward']).flatten(2)
    want = m.out_proj((m.norm(y_f, mats['gate']) + m.norm_b(y_b, mats['gate'])) / 2)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)


def test_decay_masks_factor_each_direction():
    """Below (above) the diagonal, ``M_fwd`` (``M_bwd``) is ``L_M o (C B^T) o dt_j``."""
    m = _mixer()  # ngroups=1: one B, C group per direction
    x = torch.randn(1, L, DIM, dtype=torch.float64)
    masks, mats = m.decay_masks(x), m.mixing_matrices(x)
    h = m.num_heads
    _, dt, _, Bm, Cm, _ = m._scan_inputs(*m._project(x)[1:])
    ones = torch.diag_embed(torch.ones(1, h, L, dtype=torch.float64))
    for name, group, heads in (('forward', 0, slice(0, h)), ('backward', 1, slice(h, None))):
        lm, bm, cm, d = masks[name], Bm[0, :, group], Cm[0, :, group], dt[0, :, heads]
        if name == 'backward':  # the backward scan runs on the flipped sequence
            bm, cm, d = bm.flip(0), cm.flip(0), d.flip(0)
        off = (lambda t: t.tril(-1)) if name == 'forward' else (lambda t: t.triu(1))
        assert lm.dtype == torch.float64 and torch.equal(lm - off(lm), ones)
        want = lm[0] * (cm @ bm.T) * d.T[:, None, :]
        torch.testing.assert_close(off(mats[name][0]), off(want))
