"""The benchmark-only fast-path variants: scoped, nested, validated."""
import pytest

from mmdinomamba.ops import FastPathVariant, current_variant, fast_path_variant


def test_variant_is_scoped_and_nests():
    assert current_variant() == FastPathVariant()
    with fast_path_variant(fused_conv=False) as outer:
        assert not outer.fused_conv and current_variant() is outer
        with fast_path_variant(quadratic_max_len=0):
            assert not current_variant().fused_conv and current_variant().quadratic_max_len == 0
        assert current_variant() is outer
    assert current_variant() == FastPathVariant()


def test_unknown_switch_is_named():
    with pytest.raises(TypeError, match="unknown switch.*'fused_conf'"):
        with fast_path_variant(fused_conf=False):
            pass
    assert current_variant() == FastPathVariant()
