"""The specification of every op: pure PyTorch, any device and dtype, float64-exact.

The sequential recurrence and the mixing matrices (:mod:`.ssd_ref`), the chunked scan
(:mod:`.ssd_chunked`), the causal convs (:mod:`.conv`), the gated RMSNorm and the bidirectional
merge (:mod:`.norm`) and the whole bidirectional mixer as their composition (:mod:`.mixer`).
Nothing here imports a kernel (tested).
"""
from .conv import bidir_causal_conv1d_ref, causal_conv1d_ref
from .mixer import InnerDims, bidir_conv_scan_ref, bidir_mixer_ref
from .norm import bidir_gated_merge_ref, gated_rms_norm_ref
from .ssd_chunked import PORTABLE_CHUNK_SIZE, ssd_scan_chunked
from .ssd_ref import (check_ssd_shapes, ssd_decay_matrix, ssd_mixing_matrix, ssd_scan_quadratic_ref,
                      ssd_scan_ref)

__all__ = [
    'ssd_scan_ref', 'ssd_scan_chunked', 'ssd_mixing_matrix', 'ssd_decay_matrix',
    'check_ssd_shapes', 'PORTABLE_CHUNK_SIZE', 'ssd_scan_quadratic_ref', 'causal_conv1d_ref',
    'bidir_causal_conv1d_ref', 'gated_rms_norm_ref', 'bidir_gated_merge_ref', 'InnerDims',
    'bidir_conv_scan_ref', 'bidir_mixer_ref'
]
