"""Stop DINO training early, with a clear message, on a non-finite loss or a collapsed teacher."""
import math
from typing import Optional

from mmengine.hooks import Hook
from mmpretrain.registry import HOOKS

from .dino_teacher_hook import unwrap_model

__all__ = ['DINOCollapseMonitorHook']


def _value(x) -> float:
    return float(x.detach()) if hasattr(x, 'detach') else float(x)


NAN_HINT = ('Try: a lower learning rate or a longer warm-up, gradient clipping '
            '(optim_wrapper.clip_grad=dict(max_norm=3.0)), training without fp16 AMP, or a larger '
            'out_dim / batch (facebookresearch/dino issues #58, #263).')
UNIFORM_HINT = ('The teacher output is ~uniform (centering dominates sharpening). Try: a lower '
                'teacher_temp (sharper teacher, e.g. 0.04 or 0.02; dino#43), a lower '
                'momentum_teacher (e.g. 0.99), a higher lr, or a larger batch.')
ONEHOT_HINT = ('The teacher output concentrates on one dimension (sharpening dominates '
               'centering). Try: a higher teacher_temp or warmup_teacher_temp, a higher '
               'center_momentum in the loss, a lower lr, or a larger batch.')


@HOOKS.register_module()
class DINOCollapseMonitorHook(Hook):
    """Watch the DINO model's logged signals after every iteration.

    Raises ``RuntimeError`` (naming the iteration, the signal, its value and what to try) when

    * ``loss`` (or ``teacher_entropy`` / ``kl``) is NaN or inf, at once;
    * the teacher collapsed: its mean entropy ``H`` (nats) stayed below
      ``min_entropy_ratio * log(K)`` (one-dimension collapse) or above
      ``max_entropy_ratio * log(K)`` (uniform collapse), ``K`` the head's output dimension,
      for ``patience`` consecutive iterations (iterations before ``begin_iter`` do not count).

    Args:
        patience (int): consecutive collapsed iterations before stopping. Defaults to 200.
        min_entropy_ratio (float): lower entropy bound as a fraction of ``log(K)``.
            Defaults to 0.01.
        max_entropy_ratio (float): upper bound as a fraction of ``log(K)``. Defaults to 0.995.
        begin_iter (int): first (0-based) iteration that is checked for collapse.
            Defaults to 0.
        out_dim (int, optional): ``K``; by default read from ``model.head.out_channels``.
    """
    priority = 'NORMAL'

    def __init__(self, patience: int = 200, min_entropy_ratio: float = 0.01,
                 max_entropy_ratio: float = 0.995, begin_iter: int = 0,
                 out_dim: Optional[int] = None):
        if patience < 1:
            raise ValueError(f'DINOCollapseMonitorHook: patience={patience} must be >= 1')
        if not 0 <= min_entropy_ratio < max_entropy_ratio <= 1:
            raise ValueError('DINOCollapseMonitorHook: need 0 <= min_entropy_ratio '
                             f'({min_entropy_ratio}) < max_entropy_ratio ({max_entropy_ratio}) '
                             '<= 1')
        self.patience, self.begin_iter, self.out_dim = patience, begin_iter, out_dim
        self.min_ratio, self.max_ratio = min_entropy_ratio, max_entropy_ratio
        self._streak, self._kind, self._since = 0, None, None

    def before_train(self, runner) -> None:
        if self.out_dim is None:
            head = getattr(unwrap_model(runner.model), 'head', None)
            if getattr(head, 'out_channels', None) is None:
                raise TypeError('DINOCollapseMonitorHook: cannot read out_dim from '
                                'model.head.out_channels; pass out_dim=')
            self.out_dim = head.out_channels
        self._streak, self._kind, self._since = 0, None, None

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if not outputs:
            return
        it = runner.iter + 1
        for key in ('loss', 'teacher_entropy', 'kl'):
            if key in outputs and not math.isfinite(_value(outputs[key])):
                raise RuntimeError(f'DINO training stopped at iteration {it} (epoch '
                                   f'{runner.epoch + 1}): {key} is {_value(outputs[key])}. '
                                   + NAN_HINT)
        if 'teacher_entropy' not in outputs or runner.iter < self.begin_iter:
            return
        self._check_collapse(runner, it, _value(outputs['teacher_entropy']),
                             _value(outputs.get('kl', float('nan'))))

    def _check_collapse(self, runner, it: int, entropy: float, kl: float) -> None:
        log_k = math.log(self.out_dim)
        kind = ('one-dimension' if entropy < self.min_ratio * log_k else
                'uniform' if entropy > self.max_ratio * log_k else None)
        if kind is None or kind != self._kind:
            self._streak, self._kind, self._since = 0, kind, it
        if kind is None:
            return
        self._streak += 1
        if self._streak >= self.patience:
            bound = (f'< {self.min_ratio} x log(K)' if kind == 'one-dimension' else
                     f'> {self.max_ratio} x log(K)')
            raise RuntimeError(
                f'DINO training stopped at iteration {it} (epoch {runner.epoch + 1}): '
                f'{kind} collapse of the teacher. Signal teacher_entropy = {entropy:.4f} nats '
                f'(log(K) = {log_k:.4f} for K = {self.out_dim}; ratio {entropy / log_k:.4f} '
                f'{bound}) for {self._streak} consecutive iterations since iteration '
                f'{self._since}; kl(teacher||student) = {kl:.4g}. '
                + (ONEHOT_HINT if kind == 'one-dimension' else UNIFORM_HINT))
