"""The CUDA kernels: our Triton kernels (:mod:`.bidir_conv_triton`, :mod:`.bidir_merge_triton`,
:mod:`.bidir_conv_scan_triton`) and the guarded glue to ``mamba_ssm`` and ``causal_conv1d``
(:mod:`._triton`, the one place they are imported, lazily). Importing this package imports
neither Triton nor ``mamba_ssm``: the package runs without them and without a GPU."""
from . import _triton

__all__ = ['_triton']
