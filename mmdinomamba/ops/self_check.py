"""What the kernels' self-checks share: the reference's graph kept to itself, and the
comparison.

A self-check runs on a kernel's first call, which may come from inside ``torch.no_grad``,
inference mode, autocast or a non-reentrant activation checkpoint (the region that makes the
first call). :func:`reference_graph` turns autograd on and autocast and inference mode off, and
installs identity saved-tensor hooks, so the check's saved tensors never reach a checkpoint's
hooks; nothing a check returns carries a graph, so the region saves the same tensors when it is
recomputed.
"""
import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

__all__ = ['reference_graph', 'mismatch']


def _identity(t: Tensor) -> Tensor:
    return t


@contextlib.contextmanager
def reference_graph(device_type: str = 'cpu') -> Iterator[None]:
    """Autograd on, autocast off, outside inference mode, identity saved-tensor hooks."""
    with torch.inference_mode(False), torch.enable_grad(), torch.autocast(
            device_type, enabled=False), torch.autograd.graph.saved_tensors_hooks(
                _identity, _identity):
        yield


def mismatch(names: Sequence[str], got: Sequence[Tensor], want: Sequence[Tensor],
             tol: float) -> str | None:
    """The first of ``names`` whose ``got`` differs from ``want`` by a relative error (norm) of
    more than ``tol`` (NaN too), with its error, or None."""
    for name, g, w in zip(names, got, want):
        err = ((g.double() - w.double()).norm() / w.double().norm()).item()
        if not err <= tol:
            return f'{name}: relative error {err:.2e}'
    return None
