"""SSD scan and its companions: reference, portable PyTorch and Triton dispatch.

Nothing here imports Triton, ``mamba_ssm`` or ``causal_conv1d`` at import time; optional
CUDA kernels are looked up on first use with CUDA tensors (``_triton.py``).
"""
from ._triton import portable_ops
from .bidir_conv import bidir_causal_conv1d
from .bidir_conv_scan import bidir_conv_scan
from .bidir_inner import InnerDims, bidir_ssd_inner
from .bidir_merge import bidir_gated_merge
from .conv import causal_conv1d
from .cpu_allocator import keep_freed_cpu_memory
from .norm import RMSNorm, gated_rms_norm, rms_norm
from .ssd import (PORTABLE_CHUNK_SIZE, SSD_BACKENDS, WIDE_TOKENS, quadratic_form_by_length,
                  ssd_scan, use_quadratic_form)
from .ssd_chunked import ssd_scan_chunked
from .ssd_quadratic import ssd_scan_quadratic
from .ssd_recurrent import ssd_scan_recurrent
from .ssd_ref import ssd_decay_matrix, ssd_mixing_matrix, ssd_scan_ref
from .variants import (QUADRATIC_MAX_LEN, FastPathVariant, current_variant, fast_path_variant,
                       quadratic_max_len)

__all__ = [
    'ssd_scan', 'use_quadratic_form', 'quadratic_form_by_length', 'WIDE_TOKENS', 'ssd_scan_ref',
    'ssd_scan_chunked', 'ssd_scan_quadratic', 'ssd_scan_recurrent', 'ssd_mixing_matrix',
    'ssd_decay_matrix',
    'gated_rms_norm', 'rms_norm', 'RMSNorm',
    'causal_conv1d', 'bidir_causal_conv1d',
    'bidir_conv_scan', 'bidir_gated_merge', 'bidir_ssd_inner', 'InnerDims', 'portable_ops',
    'fast_path_variant', 'current_variant', 'FastPathVariant', 'SSD_BACKENDS',
    'PORTABLE_CHUNK_SIZE', 'QUADRATIC_MAX_LEN', 'quadratic_max_len', 'keep_freed_cpu_memory'
]
