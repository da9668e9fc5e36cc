"""Shared model building blocks (patch embedding, MLP, drop path, position embeddings) and
checkpoint helpers (picking, strict loading, converter utilities)."""
from .checkpoint import (CheckpointMismatchError, add_prefix, backbone_state_dict, build_on_meta,
                         check_output_path, compare_keys, converter_weights, format_key_report,
                         init_weights_strict, load_backbone_checkpoint, load_checkpoint_strict,
                         load_state_dict_checked, require_keys, save_atomic, select_state_dict,
                         split_pretrained_cfg, strip_prefix)
from .layers import DropPath, Mlp, PatchEmbed
from .pos_embed import infer_grid, resize_pos_embed

__all__ = [
    'DropPath', 'Mlp', 'PatchEmbed', 'infer_grid', 'resize_pos_embed', 'build_on_meta',
    'compare_keys', 'format_key_report', 'select_state_dict', 'strip_prefix', 'add_prefix',
    'CheckpointMismatchError', 'backbone_state_dict', 'load_state_dict_checked',
    'load_backbone_checkpoint', 'init_weights_strict', 'split_pretrained_cfg',
    'load_checkpoint_strict', 'converter_weights', 'require_keys', 'check_output_path',
    'save_atomic'
]
