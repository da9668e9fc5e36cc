"""The benchmark-only fast-path variants: scoped, nested, validated."""
import pytest

from mmdinomamba.ops import (QUADRATIC_MAX_LEN, FastPathVariant, current_variant,
                             fast_path_variant, quadratic_max_len)


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


def test_quadratic_form_length_depends_on_head_size_unless_set():
    assert quadratic_max_len(64, 64) == QUADRATIC_MAX_LEN
    assert quadratic_max_len(16, 16) == quadratic_max_len(64, 16) == QUADRATIC_MAX_LEN // 2
    with fast_path_variant(quadratic_max_len=7):
        assert quadratic_max_len(64, 64) == quadratic_max_len(16, 16) == 7
