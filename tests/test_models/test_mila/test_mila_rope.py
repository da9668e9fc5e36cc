"""2-D RoPE: any grid, a rotation (norm preserving), relative, and the MILA channel layout."""
import math

import pytest
import torch

from mmdinomamba.models.utils.rope import apply_rope_2d, rope_2d_cos_sin

GRIDS = [(1, 1), (3, 5), (4, 4), (7, 2)]


def _reference(x, hw, base=10000.):
    """Independent complex-number reference: pair f < D/4 turns by row * theta_f, the next
    D/4 pairs by col * theta_f."""
    h, w = hw
    d = x.shape[-1]
    k = d // 4
    theta = [base**(-f / k) for f in range(k)]
    out = torch.empty_like(x)
    for i in range(h):
        for j in range(w):
            t = i * w + j
            z = torch.view_as_complex(x[..., t, :].reshape(*x.shape[:-2], d // 2, 2).contiguous())
            ang = torch.tensor([i * th for th in theta] + [j * th for th in theta],
                               dtype=torch.float64)
            rot = torch.polar(torch.ones_like(ang), ang)
            out[..., t, :] = torch.view_as_real(z * rot).reshape(*x.shape[:-2], d)
    return out


@pytest.mark.parametrize('hw', GRIDS)
def test_matches_complex_reference_any_grid(hw):
    x = torch.randn(2, hw[0] * hw[1], 16, dtype=torch.float64)
    torch.testing.assert_close(apply_rope_2d(x, hw), _reference(x, hw))


@pytest.mark.parametrize('hw', GRIDS)
def test_norm_preserving(hw):
    x = torch.randn(3, hw[0] * hw[1], 8, dtype=torch.float64)
    torch.testing.assert_close(apply_rope_2d(x, hw).norm(dim=-1), x.norm(dim=-1))


def test_relative_position_only():
    """<R_m q, R_n k> depends only on the 2-D offset m - n."""
    h, w, d = 5, 6, 16
    q = torch.randn(d, dtype=torch.float64).expand(h * w, d)
    k = torch.randn(d, dtype=torch.float64).expand(h * w, d)
    dots = apply_rope_2d(q, (h, w)) @ apply_rope_2d(k, (h, w)).T  # (L, L)
    pos = [(i, j) for i in range(h) for j in range(w)]
    by_offset = {}
    for m, (im, jm) in enumerate(pos):
        for n, (in_, jn) in enumerate(pos):
            by_offset.setdefault((im - in_, jm - jn), []).append(dots[m, n])
    assert len(by_offset) == (2 * h - 1) * (2 * w - 1)
    for vals in by_offset.values():
        torch.testing.assert_close(torch.stack(vals), vals[0].expand(len(vals)))
    # and it is not trivially constant: different offsets give different products
    assert not torch.allclose(dots[0, 1], dots[0, w])


def test_angles_layout_and_dtype():
    cos, sin = rope_2d_cos_sin((2, 3), 8, dtype=torch.float64)
    assert cos.shape == sin.shape == (6, 4)
    # position (1, 2) = token 5: pairs 0, 1 use the row (1), pairs 2, 3 the column (2)
    theta = torch.tensor([1., 10000**-0.5], dtype=torch.float64)
    torch.testing.assert_close(cos[5], torch.cat([torch.cos(1 * theta), torch.cos(2 * theta)]))
    x = torch.randn(6, 8).half()
    assert apply_rope_2d(x, (2, 3)).dtype == torch.float16
    torch.testing.assert_close(apply_rope_2d(torch.zeros(1, 6, 8), (2, 3)), torch.zeros(1, 6, 8))
    assert math.isclose(float(cos[0, 0]), 1.)


def test_errors():
    with pytest.raises(ValueError, match='multiple of 4'):
        apply_rope_2d(torch.randn(6, 6), (2, 3))
    with pytest.raises(ValueError, match='do not match the grid 2x2'):
        apply_rope_2d(torch.randn(6, 8), (2, 2))
