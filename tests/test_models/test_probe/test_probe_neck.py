"""ProbeFeatureNeck: every pooling strategy of Table 6 computes what it says, feature sizes."""
import pytest
import torch

from mmdinomamba.models.backbones.layout import (front_cls_layout, middle_cls_layout,
                                                 register_layout)
from mmdinomamba.models.necks import POOLINGS, ProbeFeatureNeck, pool_tokens

C = 8


def _tokens(layout, batch=3):
    return torch.randn(batch, layout.length, C)


def _patch_loop(tokens, layout, reduce):
    """Independent reference: loop over positions that are neither cls nor register."""
    special = set(layout.register_index.tolist())
    if layout.cls_index is not None:
        special.add(layout.cls_index)
    special |= set(layout.extra_index.tolist())
    rows = [tokens[:, i] for i in range(layout.length) if i not in special]
    stack = torch.stack(rows, dim=1)
    return stack.mean(1) if reduce == 'mean' else stack.max(1).values


@pytest.mark.parametrize('layout', [front_cls_layout(3, 4), middle_cls_layout(4, 4)],
                         ids=['front-cls', 'middle-cls'])
def test_each_pooling_on_cls_layouts(layout):
    t = _tokens(layout)
    cls = t[:, layout.cls_index]
    mean, mx = _patch_loop(t, layout, 'mean'), _patch_loop(t, layout, 'max')
    expected = {'cls': cls, 'mean': mean, 'max': mx, 'cls+mean': torch.cat([cls, mean], 1),
                'cls+max': torch.cat([cls, mx], 1)}
    for name, want in expected.items():
        torch.testing.assert_close(pool_tokens(t, layout, name), want)
    # the middle cls of a 4x4 grid sits at index 8, between patches 7 and 8
    if layout.cls_index != 0:
        assert layout.cls_index == 8


def test_register_layout_cls_is_register_mean_and_registers_concat():
    layout = register_layout(4, 4, 3)  # 16 patches, registers at 4, 9, 14
    assert layout.register_index.tolist() == [4, 9, 14]
    t = _tokens(layout)
    regs = [t[:, 4], t[:, 9], t[:, 14]]
    torch.testing.assert_close(pool_tokens(t, layout, 'cls'), sum(regs) / 3)
    torch.testing.assert_close(pool_tokens(t, layout, 'registers'), torch.cat(regs, 1))
    torch.testing.assert_close(pool_tokens(t, layout, 'mean'), _patch_loop(t, layout, 'mean'))


def test_neck_concatenates_blocks_in_order_and_appends_avgpool():
    layout = middle_cls_layout(2, 3)
    blocks = [_tokens(layout) for _ in range(3)]
    neck = ProbeFeatureNeck(pooling='cls', avgpool=True)
    (feat, ) = neck(blocks, layout)
    want = torch.cat([b[:, layout.cls_index] for b in blocks] +
                     [_patch_loop(blocks[-1], layout, 'mean')], 1)
    torch.testing.assert_close(feat, want)
    assert feat.shape[1] == C * 3 + C == neck.out_channels(C, 3)


@pytest.mark.parametrize('pooling', sorted(POOLINGS))
@pytest.mark.parametrize('avgpool', [False, True])
def test_out_channels_matches_forward(pooling, avgpool):
    layout = register_layout(3, 3, 2) if pooling == 'registers' else front_cls_layout(3, 3)
    neck = ProbeFeatureNeck(pooling=pooling, avgpool=avgpool)
    (feat, ) = neck([_tokens(layout) for _ in range(2)], layout)
    expected_per_block = {'registers': 2, 'cls+mean': 2, 'cls+max': 2}.get(pooling, 1)
    assert feat.shape == (3, C * (2 * expected_per_block + int(avgpool)))
    assert feat.shape[1] == neck.out_channels(C, 2, num_registers=2)


def test_bad_pooling_and_missing_tokens_raise():
    with pytest.raises(ValueError, match='pooling'):
        ProbeFeatureNeck(pooling='median')
    layout = front_cls_layout(2, 2)
    with pytest.raises(ValueError, match='register'):
        pool_tokens(_tokens(layout), layout, 'registers')
    with pytest.raises(ValueError, match='no block'):
        ProbeFeatureNeck()([], layout)
