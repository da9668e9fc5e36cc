"""Shared model building blocks (patch embedding, MLP, drop path, position embeddings),
checkpoint helpers (picking, strict loading) and the checkpoint converters' flow."""
from .checkpoint import (BACKBONE_PREFIXES, DINO_BACKBONE_PREFIXES, CheckpointMismatchError,
                         add_prefix, backbone_state_dict, build_on_meta, compare_keys,
                         format_key_report, init_weights_strict, load_backbone_checkpoint,
                         load_checkpoint_strict, load_state_dict_checked, select_state_dict,
                         split_pretrained_cfg, strip_prefix, strip_wrapper_prefix)
from .checkpoint_file import (CheckpointFileError, check_checkpoint_file,
                              checkpoint_file_problem, read_checkpoint)
from .converter import (backbone_only, check_output_path, converter_weights, require_keys,
                        run_converter, save_atomic)
from .layers import DropPath, Mlp, PatchEmbed
from .pos_embed import infer_grid, resize_pos_embed

__all__ = [
    'DropPath', 'Mlp', 'PatchEmbed', 'infer_grid', 'resize_pos_embed', 'build_on_meta',
    'compare_keys', 'format_key_report', 'select_state_dict', 'strip_prefix', 'add_prefix',
    'strip_wrapper_prefix', 'BACKBONE_PREFIXES', 'DINO_BACKBONE_PREFIXES',
    'CheckpointMismatchError', 'backbone_state_dict', 'load_state_dict_checked',
    'load_backbone_checkpoint', 'init_weights_strict', 'split_pretrained_cfg',
    'load_checkpoint_strict', 'converter_weights', 'require_keys', 'backbone_only',
    'check_output_path', 'save_atomic', 'run_converter', 'CheckpointFileError',
    'check_checkpoint_file', 'checkpoint_file_problem', 'read_checkpoint'
]
