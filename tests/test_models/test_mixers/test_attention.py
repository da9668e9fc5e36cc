"""SoftmaxAttention and LinearAttention: forward == proj(M @ V), M's exact form, registry."""
import pytest
import torch
import torch.nn.functional as F

from mmdinomamba.models.mixers import LinearAttention, SoftmaxAttention

B, L, C, HEADS = 2, 11, 32, 4
D = C // HEADS


def _heads(t):
    """(B, L, C) -> (B, heads, L, d)."""
    return t.reshape(t.shape[0], t.shape[1], HEADS, D).transpose(1, 2)


def _qkv(mixer, x):
    """Independent q, k, v from the qkv weights: rows [0:C] q, [C:2C] k, [2C:3C] v."""
    w, b = mixer.qkv.weight, mixer.qkv.bias
    return [_heads(x @ w[i * C:(i + 1) * C].T + b[i * C:(i + 1) * C]) for i in range(3)]


def _merge(mixer, y):
    """(B, heads, L, d) -> proj of the concatenated heads (B, L, C)."""
    return mixer.proj(y.transpose(1, 2).reshape(y.shape[0], y.shape[2], C))


def test_softmax_attention_matrix_is_exact():
    mixer = SoftmaxAttention(C, HEADS).eval()
    x = torch.randn(B, L, C)
    q, k, v = _qkv(mixer, x)
    want = torch.softmax(q @ k.transpose(-1, -2) / D**0.5, dim=-1)
    m = mixer.mixing_matrix(x)
    assert m.shape == (B, HEADS, L, L) and mixer.num_heads == HEADS
    torch.testing.assert_close(m, want)
    torch.testing.assert_close(m.sum(-1), torch.ones(B, HEADS, L))
    torch.testing.assert_close(mixer(x, (1, L)), _merge(mixer, m @ v), rtol=1e-5, atol=1e-6)


def test_softmax_attention_dropout_only_in_training():
    mixer = SoftmaxAttention(C, HEADS, attn_drop=0.5)
    x = torch.randn(B, L, C)
    mixer.eval()
    y_eval = mixer(x)
    torch.testing.assert_close(mixer(x), y_eval)
    mixer.train()
    assert not torch.allclose(mixer(x), y_eval)


def _psi_softmax(q, k):
    """psi(Q): softmax of each query row over features; psi(K): each key feature over tokens."""
    return torch.softmax(q, dim=-1), torch.softmax(k, dim=-2)


@pytest.mark.parametrize('kernel', ['softmax', 'elu'])
def test_linear_attention_matrix_is_exact(kernel):
    mixer = LinearAttention(C, HEADS, kernel=kernel).eval()
    x = torch.randn(B, L, C)
    q, k, v = _qkv(mixer, x)
    if kernel == 'softmax':
        pq, pk = _psi_softmax(q, k)
        want = pq @ pk.transpose(-1, -2)
    else:
        pq, pk = F.elu(q) + 1, F.elu(k) + 1
        raw = pq @ pk.transpose(-1, -2)
        want = raw / (raw.sum(-1, keepdim=True) + mixer.eps)
    m = mixer.mixing_matrix(x)
    torch.testing.assert_close(m, want, rtol=1e-5, atol=1e-6)
    assert (m >= 0).all()
    torch.testing.assert_close(m.sum(-1), torch.ones(B, HEADS, L), rtol=1e-5, atol=1e-5)
    # forward (O(L d^2)) equals the explicit mixing step through M
    torch.testing.assert_close(mixer(x), _merge(mixer, m @ v), rtol=1e-5, atol=1e-6)


def test_linear_attention_rank_is_bounded_by_head_dim():
    mixer = LinearAttention(C, 2).double()  # head dim 16 < L = 40
    m = mixer.mixing_matrix(torch.randn(1, 40, C, dtype=torch.float64))
    assert int(torch.linalg.matrix_rank(m[0, 0])) <= C // 2
    soft = SoftmaxAttention(C, 2).double().mixing_matrix(torch.randn(1, 40, C, dtype=torch.float64))
    assert int(torch.linalg.matrix_rank(soft[0, 0])) > C // 2


@pytest.mark.parametrize('cls', [SoftmaxAttention, LinearAttention])
def test_mixers_backward_and_registry(cls):
    from mmpretrain.registry import MODELS
    mixer = MODELS.build(dict(type=cls.__name__, embed_dims=C, num_heads=HEADS))
    assert isinstance(mixer, cls)
    x = torch.randn(B, L, C, requires_grad=True)
    mixer(x).square().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert all(p.grad is not None for p in mixer.parameters())


def test_mixer_errors():
    with pytest.raises(ValueError, match='not divisible'):
        SoftmaxAttention(30, 4)
    with pytest.raises(ValueError, match='not divisible'):
        LinearAttention(30, 4)
    with pytest.raises(ValueError, match="kernel='relu'"):
        LinearAttention(C, HEADS, kernel='relu')
