"""SSD (Mamba-2) scan and its companions: reference, portable PyTorch and Triton dispatch.

Nothing here imports Triton, ``mamba_ssm`` or ``causal_conv1d`` at import time; optional
CUDA kernels are looked up on first use with CUDA tensors (``_triton.py``).
"""
from ._triton import portable_ops
from .bidir_conv import bidir_causal_conv1d
from .bidir_conv_scan import bidir_conv_scan
from .bidir_merge import bidir_gated_merge
from .conv import causal_conv1d
from .norm import gated_rms_norm
from .ssd import PORTABLE_CHUNK_SIZE, SSD_BACKENDS, ssd_scan
from .ssd_chunked import ssd_scan_chunked
from .ssd_ref import ssd_decay_matrix, ssd_mixing_matrix, ssd_scan_ref

__all__ = [
    'ssd_scan', 'ssd_scan_ref', 'ssd_scan_chunked', 'ssd_mixing_matrix', 'ssd_decay_matrix',
    'gated_rms_norm',
    'causal_conv1d', 'bidir_causal_conv1d', 'bidir_conv_scan', 'bidir_gated_merge',
    'portable_ops', 'SSD_BACKENDS', 'PORTABLE_CHUNK_SIZE'
]
