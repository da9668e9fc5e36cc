"""Read many logged device scalars to the host at once, every ``interval`` iterations.

A training iteration of DINO returns its logged values as 0-dim device tensors. Reading one to
the host (``float()``, ``.item()``) waits for the device to finish the iteration and stops the
host from queueing the next one; the DINO hooks keep them and read them together, in one
copy, when they are needed (the logging interval, the end of an epoch, a checkpoint).
"""
from typing import Iterable, List, Optional

import torch
from mmengine.hooks import LoggerHook

__all__ = ['to_host', 'logging_interval', 'read_due']


def to_host(values: Iterable) -> List:
    """Python numbers of ``values`` (numbers or one-element tensors), with a single host read
    for all the tensors. Floating tensors give floats, integer and bool tensors ints / bools,
    as ``.item()`` gives them."""
    values = list(values)
    tensors = [(i, v) for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
    out = list(values)
    if not tensors:
        return out
    for v in (v for _, v in tensors):
        if v.numel() != 1:
            raise ValueError(f'to_host: a logged value must have one element, got shape '
                             f'{tuple(v.shape)}')
    # float64 holds every float32 / bfloat16 / float16 value and every int below 2**53 exactly
    flat = torch.stack([v.detach().reshape(()).to(torch.float64) for _, v in tensors]).tolist()
    for (i, v), x in zip(tensors, flat):
        if v.dtype == torch.bool:
            x = bool(x)
        elif not (v.is_floating_point() or v.is_complex()):
            x = int(x)
        out[i] = x
    return out


def logging_interval(runner, interval: Optional[int]) -> int:
    """``interval`` if given, else the interval of the runner's ``LoggerHook`` (1 without
    one)."""
    if interval is not None:
        if interval < 1:
            raise ValueError(f'interval={interval} must be >= 1')
        return int(interval)
    for hook in getattr(runner, 'hooks', ()):
        if isinstance(hook, LoggerHook):
            return int(hook.interval)
    return 1


def read_due(hook, runner, batch_idx: int, interval: int) -> bool:
    """Whether the values kept so far are read after this iteration: when the ``LoggerHook``
    logs (every ``interval`` iterations of the epoch, and at its end) and at the last
    iteration."""
    loader = getattr(runner, 'train_dataloader', None)
    return (hook.every_n_inner_iters(batch_idx, interval)
            or (loader is not None and hook.end_of_epoch(loader, batch_idx))
            or runner.iter + 1 >= getattr(runner, 'max_iters', float('inf')))
