"""MambaLikeLinearAttention: each design switch does what it says; M is exact for all of them."""
import itertools

import pytest
import torch
import torch.nn.functional as F

from mmdinomamba.models.mixers.mila import MambaLikeLinearAttention
from mmdinomamba.models.utils.rope import apply_rope_2d
from mmdinomamba.ops import ssd_scan_ref

HW = (3, 4)
C = 16


def _x(b=2, hw=HW, c=C):
    return torch.randn(b, hw[0] * hw[1], c, dtype=torch.float64)


def _mixer(**kw):
    kw.setdefault('num_heads', 2)
    return MambaLikeLinearAttention(C, **kw).double()


def _qkv(m, x):
    """phi(q), phi(k), v (B, L, h, .) straight from the module's weights ('vit' design)."""
    b, length, _ = x.shape
    h, n = m.num_heads, m.qk_dim
    q, k = (F.elu(t) + 1 for t in m.qk(x).reshape(b, length, 2, h, n).unbind(2))
    v = (x if m.v is None else m.v(x)).reshape(b, length, h, -1)
    return q, k, v


def _dt(m, x):
    return F.softplus(m.dt_proj(x) + m.dt_bias)


def _direct(q, k, v, normalize, col_scale=None):
    """Attention computed densely: (phi(q) phi(k)^T [* Delta_j]) [/ row sum] @ v."""
    s = torch.einsum('bihn,bjhn->bhij', q, k)
    w = s if col_scale is None else s * col_scale.transpose(1, 2)[:, :, None, :]
    if normalize:
        w = w / s.sum(-1, keepdim=True)
    return torch.einsum('bhij,bjhp->bihp', w, v)


def _apply(M, v):
    return torch.einsum('bhij,bjhp->bihp', M, v)


SWITCHES = list(itertools.product(
    [False, True], [False, True], [False, True], [False, True], [1, 2], ['vit', 'mamba'],
    [False, True], [False, True]))


@pytest.mark.parametrize('ig,fg,sc,norm,heads,design,rope,lepe', SWITCHES)
def test_mixing_matrix_exact_every_combination(ig, fg, sc, norm, heads, design, rope, lepe):
    directions = ['bi', 'causal'] if fg else ['bi']
    for direction in directions:
        m = _mixer(num_heads=heads, input_gate=ig, forget_gate=fg, shortcut=sc, normalize=norm,
                   block_design=design, rope=rope, lepe=lepe, direction=direction)
        x = _x()
        out = m.attention(x, HW)
        M = m.mixing_matrix(x, HW)
        assert M.shape == (2, heads, 12, 12)
        torch.testing.assert_close(_apply(M, out['v']), out['mixed'])
        if fg and direction == 'causal':
            assert M.triu(1).abs().max() == 0
        # forward = out_proj((M v + D v + LePE(v)) [* gate])
        y = m(x, HW)
        assert y.shape == x.shape and torch.isfinite(y).all()


def test_plain_linear_attention():
    """Forget gate off, normalization on == phi(Q) phi(K)^T V / row sums, then proj."""
    m = _mixer(eps=0.)
    x = _x()
    q, k, v = _qkv(m, x)
    ref = _direct(q, k, v, True).reshape(x.shape)
    torch.testing.assert_close(m(x), m.out_proj(ref))
    row_sums = m.mixing_matrix(x).sum(-1)
    torch.testing.assert_close(row_sums, torch.ones_like(row_sums))


def test_no_normalization_is_qktv():
    m = _mixer(normalize=False)
    x = _x()
    q, k, v = _qkv(m, x)
    torch.testing.assert_close(m.attention(x)['mixed'], _direct(q, k, v, False))


@pytest.mark.parametrize('normalize', [False, True])
def test_input_gate_scales_values(normalize):
    m = _mixer(input_gate=True, normalize=normalize, eps=0.)
    x = _x()
    q, k, v = _qkv(m, x)
    ref = _direct(q, k, v, normalize, col_scale=_dt(m, x))
    torch.testing.assert_close(m.attention(x)['mixed'], ref)


def _ssd_bi(x, dt, A, B, Cm):
    """Reference bidirectional scan from ssd_scan_ref: forward + flipped backward - diagonal."""
    fwd = ssd_scan_ref(x, dt, A, B, Cm)
    bwd = ssd_scan_ref(x.flip(1), dt.flip(1), A, B.flip(1), Cm.flip(1)).flip(1)
    return fwd + bwd - ((Cm * B).sum(-1) * dt)[..., None] * x


@pytest.mark.parametrize('input_gate', [False, True])
@pytest.mark.parametrize('direction', ['causal', 'bi'])
def test_forget_gate_is_ssd_reference(input_gate, direction):
    """Forget gate on, no normalization == the SSD reference with B = phi(K), C = phi(Q).

    Without input gate the scan sees v / dt (its input weight dt cancels); with it the gates
    share Delta = dt (Mamba-2).
    """
    m = _mixer(forget_gate=True, input_gate=input_gate, normalize=False, direction=direction)
    x = _x()
    q, k, v = _qkv(m, x)
    dt, A = _dt(m, x), -torch.exp(m.A_log)
    xin = v if input_gate else v / dt[..., None]
    scan = ssd_scan_ref if direction == 'causal' else _ssd_bi
    torch.testing.assert_close(m.attention(x)['mixed'], scan(xin, dt, A, k, q))


def test_forget_gate_normalized_against_reference():
    m = _mixer(forget_gate=True, direction='causal', eps=0.)
    x = _x()
    q, k, v = _qkv(m, x)
    dt, A = _dt(m, x), -torch.exp(m.A_log)
    num = ssd_scan_ref(v / dt[..., None], dt, A, k, q)
    den = ssd_scan_ref(torch.ones_like(v[..., :1]) / dt[..., None], dt, A, k, q)
    torch.testing.assert_close(m.attention(x)['mixed'], num / den)


def test_bidirectional_forget_gate_without_decay_is_global_attention():
    m_fg = _mixer(forget_gate=True, direction='bi', eps=0.)
    m = _mixer(eps=0.)
    m.load_state_dict(m_fg.state_dict(), strict=False)
    with torch.no_grad():
        m_fg.A_log.fill_(-60.)  # decay exp(dt A) == 1 in float64
    x = _x()
    torch.testing.assert_close(m_fg(x), m(x))


def test_shortcut_adds_D_times_v():
    m0, m1 = _mixer(), _mixer(shortcut=True)
    m1.load_state_dict(m0.state_dict(), strict=False)
    with torch.no_grad():
        m1.D.uniform_(-1, 1)
    x = _x()
    _, _, v = _qkv(m0, x)
    diff = m1(x) - m0(x)
    torch.testing.assert_close(diff, F.linear(v.reshape(x.shape) * m1.D, m1.out_proj.weight))


def test_lepe_adds_depthwise_conv_of_v():
    m0, m1 = _mixer(), _mixer(lepe=True)
    m1.load_state_dict(m0.state_dict(), strict=False)
    x = _x()
    _, _, v = _qkv(m0, x)
    img = v.reshape(2, *HW, C).permute(0, 3, 1, 2)
    lepe = F.conv2d(img, m1.lepe.weight, m1.lepe.bias, padding=1, groups=C)
    ref = F.linear(lepe.flatten(2).transpose(1, 2), m1.out_proj.weight)
    torch.testing.assert_close(m1(x, HW) - m0(x, HW), ref)


def test_single_head_small_qk():
    m = _mixer(num_heads=1, qk_dim=4)
    x = _x()
    M = m.mixing_matrix(x)
    assert M.shape == (2, 1, 12, 12) and m.qk.out_features == 8
    assert torch.linalg.matrix_rank(M[0, 0]) <= 4


def test_mamba_block_design():
    """in_proj -> dw conv -> SiLU -> attention (v = conv features), * SiLU(act_proj), out_proj."""
    m = _mixer(block_design='mamba', eps=0.)
    assert m.v is None
    x = _x()
    u = m.in_proj(x).reshape(2, *HW, C).permute(0, 3, 1, 2)
    u = F.silu(m.dwc(u)).flatten(2).transpose(1, 2)
    q, k, v = _qkv(m, u)
    att = _direct(q, k, v, True).reshape(x.shape)
    torch.testing.assert_close(m(x, HW), m.out_proj(att * F.silu(m.act_proj(x))))


def test_rope_in_numerator_only():
    m = _mixer(rope=True, eps=0.)
    x = _x()
    q, k, v = _qkv(m, x)
    rot = [apply_rope_2d(t.reshape(2, 12, C), HW).reshape(t.shape) for t in (q, k)]
    den = torch.einsum('bihn,bjhn->bhij', q, k).sum(-1, keepdim=True)
    ref = torch.einsum('bihn,bjhn->bhij', *rot) / den
    torch.testing.assert_close(m.mixing_matrix(x, HW), ref)


def test_mila_attention_matches_original_formula():
    """MILA's code: q_rope ((k_rope^T / sqrt(n)) (v / sqrt(n))) / (q . mean(k) + 1e-6) + LePE(v)."""
    m = _mixer(v_proj=False, out_proj=False, rope=True, lepe=True)
    x = _x()
    n = x.shape[1]
    q, k, _ = _qkv(m, x)
    qr, kr = (apply_rope_2d(t.reshape(2, n, C), HW).reshape(2, n, 2, 8).transpose(1, 2)
              for t in (q, k))
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    v = x.reshape(2, n, 2, 8).transpose(1, 2)
    z = 1 / (q @ k.mean(dim=-2, keepdim=True).transpose(-2, -1) + 1e-6)
    out = qr @ ((kr.transpose(-2, -1) * n**-0.5) @ (v * n**-0.5)) * z
    out = out.transpose(1, 2).reshape(2, n, C)
    lepe = m.lepe(x.transpose(1, 2).reshape(2, C, *HW)).flatten(2).transpose(1, 2)
    torch.testing.assert_close(m(x, HW), out + lepe)


def test_gradients_reach_every_parameter():
    m = _mixer(input_gate=True, forget_gate=True, shortcut=True, rope=True, lepe=True,
               block_design='mamba')
    m(_x(), HW).square().sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_float32_chunked_scan_matches_float64():
    m = _mixer(forget_gate=True, input_gate=True, chunk_size=5)
    x = _x()
    y64 = m(x)
    y32 = m.float()(x.float())
    torch.testing.assert_close(y32.double(), y64, rtol=1e-4, atol=1e-5)


def test_errors():
    with pytest.raises(ValueError, match='kernel'):
        _mixer(kernel='cos')
    with pytest.raises(ValueError, match='direction'):
        _mixer(direction='up')
    with pytest.raises(ValueError, match='block_design'):
        _mixer(block_design='conv')
    with pytest.raises(ValueError, match='not divisible'):
        MambaLikeLinearAttention(C, num_heads=3)
    with pytest.raises(ValueError, match='does not match'):
        _mixer(lepe=True)(_x(), (4, 4))
    with pytest.raises(ValueError, match='hw is needed'):
        _mixer(rope=True)(_x())
