"""The one switch between the kernels and the reference.

Every op of :mod:`mmdinomamba.ops` runs its native CPU or CUDA kernel where one applies, and
its pure-PyTorch reference (:mod:`mmdinomamba.ops.reference`) everywhere else. Inside
:func:`reference_ops`, or in a process started with ``MMDINOMAMBA_KERNELS=0``, every op runs its
reference on every device::

    with reference_ops():
        y_ref = model(x)

The choice is made when an op is called in the forward pass; a backward pass runs what its
forward pass chose. A model with activation checkpointing (``with_cp=True``) calls its ops
again when the backward pass recomputes a block: run that backward inside the context too.
"""
import contextlib
import os
from typing import Iterator

__all__ = ['ENV_SWITCH', 'reference_ops', 'kernels_enabled']

#: ``MMDINOMAMBA_KERNELS=0`` (or false / no / off) runs the reference everywhere
ENV_SWITCH = 'MMDINOMAMBA_KERNELS'
_OFF = ('0', 'false', 'no', 'off')
_ENV_OFF = os.environ.get(ENV_SWITCH, '1').strip().lower() in _OFF  # read once, here
_depth = [0]  # > 0 inside reference_ops()


@contextlib.contextmanager
def reference_ops() -> Iterator[None]:
    """Run every op's reference inside the block (nests)."""
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1


def kernels_enabled() -> bool:
    """Whether ops may run their kernels now (outside :func:`reference_ops`, and the
    environment variable not set to 0)."""
    return _depth[0] == 0 and not _ENV_OFF
