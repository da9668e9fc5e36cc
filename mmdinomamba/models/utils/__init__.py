"""Shared model building blocks (patch embedding, MLP, drop path, position embeddings)."""
from .checkpoint import (build_on_meta, compare_keys, format_key_report, select_state_dict,
                         strip_prefix)
from .layers import DropPath, Mlp, PatchEmbed
from .pos_embed import infer_grid, resize_pos_embed

__all__ = [
    'DropPath', 'Mlp', 'PatchEmbed', 'infer_grid', 'resize_pos_embed', 'build_on_meta',
    'compare_keys', 'format_key_report', 'select_state_dict', 'strip_prefix'
]
