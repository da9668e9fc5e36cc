"""The mixers' ops: one reference, one kernel per device, one switch.

* :mod:`.reference`: the specification in pure PyTorch (any device and dtype, float64-exact);
* :mod:`.cpu`: the native C++ kernels, their loader and the ``mmdinomamba::bidir_ssd`` op;
* :mod:`.cuda`: our Triton kernels and the guarded glue to ``mamba_ssm`` (imported lazily, on
  first CUDA use: the package runs without Triton, ``mamba_ssm`` or a GPU);
* the public ops here (``ssd_scan``, ``bidir_ssd``, convs, norms) pick a kernel where one
  applies and the reference elsewhere; :func:`reference_ops` (or ``MMDINOMAMBA_KERNELS=0``)
  makes every op run its reference.
"""
from .bidir_conv_scan import bidir_conv_scan
from .conv import bidir_causal_conv1d, causal_conv1d
from .cpu import native_cpu
from .mixer import QUADRATIC_MAX_LEN, bidir_ssd, quadratic_max_len
from .norm import RMSNorm, bidir_gated_merge, gated_rms_norm, rms_norm
from .reference import (InnerDims, bidir_mixer_ref, ssd_decay_matrix, ssd_mixing_matrix,
                        ssd_scan_chunked, ssd_scan_ref)
from .ssd import SSD_BACKENDS, ssd_scan
from .switch import kernels_enabled, reference_ops

__all__ = [
    'ssd_scan', 'ssd_scan_ref', 'ssd_scan_chunked', 'ssd_mixing_matrix', 'ssd_decay_matrix',
    'gated_rms_norm', 'rms_norm', 'RMSNorm',
    'causal_conv1d', 'bidir_causal_conv1d', 'bidir_conv_scan', 'bidir_gated_merge', 'bidir_ssd',
    'bidir_mixer_ref', 'InnerDims', 'reference_ops', 'kernels_enabled', 'SSD_BACKENDS',
    'QUADRATIC_MAX_LEN', 'quadratic_max_len', 'native_cpu'
]
