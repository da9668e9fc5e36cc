"""A ``TorchDispatchMode`` that fails on the operations that make the host wait for the device.

On a GPU these synchronise the host with the device (and make CUDA-graph capture impossible):

* reading a value: ``aten._local_scalar_dense`` (``.item()``, ``float(t)``, ``int(t)``,
  ``bool(t)``, ``if t:``, ``t.tolist()`` of a one-element tensor), ``aten.equal`` /
  ``allclose`` / ``is_nonzero``;
* outputs whose size depends on the values: ``nonzero``, ``unique`` (all variants),
  ``masked_select``, ``bincount``, ``repeat_interleave`` of a tensor, indexing with a boolean
  mask;
* copies between host and device: ``aten._to_copy`` / ``copy_`` whose source and result are on
  different devices, ``aten.lift_fresh`` / ``lift_fresh_copy`` (a tensor made from Python data,
  ``torch.tensor(...)`` / ``new_tensor(...)``: a pageable host-to-device copy when it is made on
  a GPU); ``Tensor.tolist`` / ``numpy`` (no aten op on a CPU: the detector wraps them while it
  is active).

What it cannot see on a CPU-only machine: every tensor is on the CPU, so no copy changes device
(a ``.to(device)`` or ``.cuda()`` that a GPU run would make is invisible) and ``non_blocking``
makes no difference; a CUDA-only code path (e.g. the Triton kernels) is not run; and waits
outside the aten ops (``torch.cuda.synchronize()``, events, a ``GradScaler``'s inf check on
another stream) are not dispatched. ``torch.cuda.set_sync_debug_mode('error')`` on a GPU covers
those. Tensors that stay on the host by design also on a GPU (AdamW's step counters with
``capturable=False``) can be allowed with ``host_tensors``.
"""
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

READS = ('_local_scalar_dense', 'item', 'equal', 'allclose', 'is_nonzero')
DATA_DEPENDENT = ('nonzero', 'unique', '_unique', '_unique2', 'unique_dim', 'unique_consecutive',
                  'unique_dim_consecutive', 'masked_select', 'bincount')
MADE_FROM_HOST = ('lift_fresh', 'lift_fresh_copy')
HOST_READS = ('tolist', 'numpy')


class HostSyncError(AssertionError):
    """An operation that synchronises the host with the device ran inside the checked code."""


def _devices(obj) -> set:
    out = set()
    if isinstance(obj, torch.Tensor):
        out.add(obj.device)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            out |= _devices(x)
    return out


class SyncDetector(TorchDispatchMode):
    """Raise :class:`HostSyncError` (naming the op and the Python line that called it) on a
    host-device synchronisation. ``allowed``: (path suffix, function) pairs of call sites that
    are allowed; ``host_tensors``: tensors whose reads are allowed. ``record=True`` collects the
    violations in :attr:`found` instead of raising."""

    def __init__(self, allowed=(), host_tensors=(), record: bool = False):
        super().__init__()
        self.allowed = tuple(allowed)
        self.host_ids = {id(t) for t in host_tensors}
        self.record, self.found = record, []

    def __enter__(self):
        # Tensor.tolist / numpy read CPU memory without an aten op: on a CPU they are invisible
        # to the mode (on a GPU they copy to the host first), so they are watched here.
        self._saved = {name: getattr(torch.Tensor, name) for name in HOST_READS}
        for name, fn in self._saved.items():
            setattr(torch.Tensor, name, self._watch(name, fn))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, fn in self._saved.items():
            setattr(torch.Tensor, name, fn)
        return super().__exit__(*exc)

    def _watch(self, name, fn):
        def watched(tensor, *args, **kwargs):
            if id(tensor) not in self.host_ids:
                self._report(f'Tensor.{name}', 'reads values to the host')
            return fn(tensor, *args, **kwargs)
        return watched

    def _report(self, what: str, why: str) -> None:
        stack = traceback.extract_stack()[:-2]
        if self._is_allowed(stack):
            return
        site = next((f for f in reversed(stack) if 'torch/' not in f.filename and
                     'sync_detector' not in f.filename), stack[-1])
        msg = f'{what} {why}, called from {site.filename}:{site.lineno} ({site.name}): {site.line}'
        if not self.record:
            raise HostSyncError(msg)
        self.found.append(msg)

    def _why(self, func, args, kwargs, out) -> str | None:
        name = func._overloadpacket.__name__
        if name in READS:
            if args and isinstance(args[0], torch.Tensor) and id(args[0]) in self.host_ids:
                return None
            return 'reads a value to the host'
        if name in DATA_DEPENDENT:
            return 'has a value-dependent output size'
        if name in MADE_FROM_HOST:
            return 'makes a tensor from host data'
        if name == 'repeat_interleave' and args and isinstance(args[0], torch.Tensor) and \
                'output_size' not in kwargs:
            return 'has a value-dependent output size'
        if name in ('index', 'index_put', 'index_put_') and len(args) > 1 and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] or ()):
            return 'indexes with a boolean mask (nonzero)'
        if name in ('_to_copy', 'copy_', 'copy'):
            src = _devices(args[1] if name != '_to_copy' else args[0])
            dst = _devices(args[0] if name != '_to_copy' else out)
            if src and dst and src != dst:
                return f'copies between devices {sorted(map(str, src | dst))}'
        return None

    def _is_allowed(self, stack) -> bool:
        return any(f.filename.endswith(path) and f.name == fn for f in stack
                   for path, fn in self.allowed)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        why = self._why(func, args, kwargs, out)
        if why is not None:
            self._report(str(func), why)
        return out
