"""Token layouts and position embeddings of the plain trunk."""
import pytest
import torch

from mmdinomamba.models.backbones.layout import (front_cls_layout, legacy_dinomamba_layout,
                                                 middle_cls_layout, register_layout)
from mmdinomamba.models.utils import resize_pos_embed


def _official_get_cls_idx(h, w, n_cls):
    """Mamba-Reg's register placement, re-derived from its description: the first n_cls groups
    are L = HW // (n_cls + 1) patches followed by one register, then the remaining patches.
    Returns (index into cat([patches, registers]), register positions)."""
    n_tok = h * w
    group = n_tok // (n_cls + 1)
    order, reg_pos = [], []
    for g in range(n_cls):
        order += list(range(g * group, (g + 1) * group))
        reg_pos.append(len(order))
        order.append(n_tok + g)
    order += list(range(group * n_cls, n_tok))
    return torch.tensor(order), torch.tensor(reg_pos)


@pytest.mark.parametrize('hw', [(14, 14), (6, 6), (16, 19), (2, 2), (1, 3)])
def test_register_layout_matches_official(hw):
    layout = register_layout(*hw, 12)
    order, reg = _official_get_cls_idx(*hw, 12)
    assert torch.equal(layout.register_index, reg)
    assert torch.equal(layout.gather_order(), order)
    assert layout.length == hw[0] * hw[1] + 12 and layout.cls_index is None


def test_register_positions_for_224():
    layout = register_layout(14, 14, 12)
    assert layout.register_index.tolist() == list(range(15, 192, 16))  # 15, 31, ..., 191
    assert layout.register_index[-1] == 191


def test_cls_layouts():
    front = front_cls_layout(14, 14)
    assert (front.length, front.cls_index) == (197, 0)
    assert torch.equal(front.patch_index, torch.arange(1, 197))
    mid = middle_cls_layout(14, 14)
    assert (mid.length, mid.cls_index) == (197, 98)
    assert mid.patch_index[97] == 97 and mid.patch_index[98] == 99
    # released Dino-Mamba: [cls+pos, patches] then the cls again at M // 2 (M = N + 1)
    legacy = legacy_dinomamba_layout(14, 14)
    assert (legacy.length, legacy.cls_index, legacy.extra_index.tolist()) == (198, 98, [0])
    assert legacy.patch_index[0] == 1 and legacy.patch_index[96] == 97
    assert legacy.patch_index[97] == 99 and legacy.patch_index[-1] == 197
    assert legacy_dinomamba_layout(6, 6).cls_index == 18  # 96 px local crops: M = 37


@pytest.mark.parametrize('make', [front_cls_layout, middle_cls_layout, legacy_dinomamba_layout,
                                  lambda h, w: register_layout(h, w, 12)])
def test_layout_is_a_permutation(make):
    layout = make(5, 7)
    every = torch.cat([layout.patch_index, layout.special_index]).sort().values
    assert torch.equal(every, torch.arange(layout.length))
    order = layout.gather_order()
    assert torch.equal(order[layout.patch_index], torch.arange(35))


@pytest.mark.parametrize('make', [front_cls_layout, middle_cls_layout, legacy_dinomamba_layout,
                                  lambda h, w: register_layout(h, w, 3)])
def test_grid_sizes_given_as_tensors_build_the_same_layout_without_warnings(make):
    """0-dim tensors (e.g. sizes from traced shapes) index as positions: no deprecated
    list-of-tensors indexing."""
    import warnings
    want = make(5, 7)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        got = make(torch.tensor(5), torch.tensor(7))
    assert got.length == want.length and got.cls_index == want.cls_index
    for name in ('patch_index', 'register_index', 'extra_index'):
        assert torch.equal(getattr(got, name), getattr(want, name)), name


def test_resize_pos_embed():
    pos = torch.randn(1, 16, 8)
    assert resize_pos_embed(pos, (4, 4), (4, 4)) is pos
    out = resize_pos_embed(pos, (4, 4), (6, 3))
    assert out.shape == (1, 18, 8)
    # a constant grid stays constant under bicubic resizing (weights sum to one)
    const = torch.ones(1, 16, 8)
    torch.testing.assert_close(resize_pos_embed(const, (4, 4), (16, 19)), torch.ones(1, 304, 8))
    with pytest.raises(ValueError, match='grid 3x3 needs 9'):
        resize_pos_embed(pos, (3, 3), (4, 4))
