"""DINO's per-iteration schedules as pure functions of the iteration (no state).

They reproduce facebookresearch/dino ``main_dino.py``: the teacher temperature is indexed by
epoch (``np.linspace(warmup, final, warmup_epochs)`` then constant) and the teacher momentum
follows ``cosine_scheduler(base, final, epochs, niter_per_ep)`` per iteration.
"""
import math

__all__ = ['teacher_temp_at', 'teacher_momentum_at', 'last_layer_frozen_at']


def _check(iteration: int, epoch_len: int) -> None:
    if iteration < 0:
        raise ValueError(f'iteration={iteration} must be >= 0')
    if epoch_len < 1:
        raise ValueError(f'epoch_len={epoch_len} must be >= 1')


def teacher_temp_at(iteration: int, epoch_len: int, warmup_temp: float, final_temp: float,
                    warmup_epochs: int) -> float:
    """Teacher temperature at ``iteration`` (0-based).

    Epoch ``e = iteration // epoch_len``; for ``e < warmup_epochs`` the value is
    ``warmup_temp + (final_temp - warmup_temp) * e / (warmup_epochs - 1)`` (DINO's
    ``np.linspace(warmup_temp, final_temp, warmup_epochs)[e]``), afterwards ``final_temp``.
    ``warmup_epochs <= 0`` means ``final_temp`` from the start.
    """
    _check(iteration, epoch_len)
    epoch = iteration // epoch_len
    if epoch >= warmup_epochs:
        return float(final_temp)
    if warmup_epochs == 1:
        return float(warmup_temp)
    return warmup_temp + (final_temp - warmup_temp) * epoch / (warmup_epochs - 1)


def teacher_momentum_at(iteration: int, max_iters: int, base: float = 0.996,
                        final: float = 1.0) -> float:
    """EMA momentum of the teacher at ``iteration``: a cosine from ``base`` (iteration 0) to
    ``final`` (``iteration == max_iters``):
    ``final + (base - final) * (1 + cos(pi * iteration / max_iters)) / 2``.
    """
    if max_iters < 1:
        raise ValueError(f'max_iters={max_iters} must be >= 1')
    _check(iteration, 1)
    t = min(iteration, max_iters) / max_iters
    return final + (base - final) * (1 + math.cos(math.pi * t)) / 2


def last_layer_frozen_at(iteration: int, epoch_len: int, freeze_epochs: float) -> bool:
    """True while the head's last layer is frozen: during the first ``freeze_epochs`` epochs
    (DINO's ``epoch < freeze_last_layer``)."""
    _check(iteration, epoch_len)
    return iteration < freeze_epochs * epoch_len
