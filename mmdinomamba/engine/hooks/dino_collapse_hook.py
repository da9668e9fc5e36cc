"""Stop DINO training early, with a clear message, on a non-finite loss or a collapsed teacher."""
import math
from typing import Optional

from mmengine.hooks import Hook
from mmpretrain.registry import HOOKS
from mmpretrain.utils import get_ori_model

from .device_scalars import logging_interval, read_due, to_host

__all__ = ['DINOCollapseMonitorHook', 'collapse_kind', 'collapse_hint']


NAN_HINT = ('Try: a lower learning rate or a longer warm-up, gradient clipping '
            '(optim_wrapper.clip_grad=dict(max_norm=3.0)), training without fp16 AMP, or a larger '
            'out_dim / batch (facebookresearch/dino issues #58, #263).')
UNIFORM_HINT = ('The teacher output is ~uniform for every image (centering dominates '
                'sharpening). Try: a lower teacher_temp (sharper teacher, e.g. 0.04 or 0.02; '
                "dino#43), Sinkhorn-Knopp centering (model.loss.centering='sinkhorn_knopp'), a "
                'lower momentum_teacher (e.g. 0.99), a higher lr, or a larger batch.')
ONEHOT_HINT = ('Every image gets the same teacher output, dominated by a few prototypes '
               '(sharpening dominates centering). Try: a higher teacher_temp, Sinkhorn-Knopp '
               "centering (model.loss.centering='sinkhorn_knopp'), a lower center_momentum in "
               'the loss (faster centering), a lower lr, or a larger batch.')


_SINKHORN = "Sinkhorn-Knopp centering (model.loss.centering='sinkhorn_knopp'), "


def collapse_hint(kind: str, model=None) -> str:
    """What to try against a collapse of ``kind`` ('uniform' or 'one-dimension'): the hint
    naming the DINO ``model``'s own settings where it has them (its teacher temperature, teacher
    momentum and centering), and not suggesting Sinkhorn-Knopp centering where it is in use."""
    hint = ONEHOT_HINT if kind == 'one-dimension' else UNIFORM_HINT
    if model is None:
        return hint
    if getattr(getattr(model, 'dino_loss', None), 'centering', None) == 'sinkhorn_knopp':
        hint = hint.replace(_SINKHORN, '')
    temp = getattr(model, 'temp_cfg', {}).get('final_temp')
    momentum = getattr(model, 'momentum_cfg', {}).get('base')
    now = [f'{name} = {value:g}' for name, value in (('teacher_temp', temp),
                                                    ('momentum_teacher', momentum))
           if value is not None]
    if getattr(model, 'koleo_weight', None):
        now.append(f'koleo_weight = {model.koleo_weight:g}')
    return hint + (f' (The run has {", ".join(now)}.)' if now else '')


def collapse_kind(entropy: float, batch_entropy: float, log_k: float,
                  max_entropy_ratio: float = 0.995, min_info_ratio: float = 0.02
                  ) -> Optional[str]:
    """Which collapse (if any) the teacher's signals show.

    ``info = batch_entropy - entropy`` is the information the teacher output carries about the
    image (the mutual information between image and prototype under the teacher; log of the
    number of equally used clusters for a sharp teacher, 0 when every image gets the same
    distribution). A healthy teacher has a high ``info``; both of DINO's collapses have none.

    Args:
        entropy (float): mean per-image teacher entropy (nats).
        batch_entropy (float): entropy of the batch-mean teacher distribution (nats).
        log_k (float): ``log(K)`` of the head's output dimension K.
        max_entropy_ratio (float): per-image entropy above this fraction of ``log K`` is the
            uniform collapse. Defaults to 0.995.
        min_info_ratio (float): ``info`` below this fraction of ``log K`` is a collapse:
            'uniform' when the batch-mean distribution is near uniform too (entropy above
            0.9 ``log K``), else 'one-dimension' (every image on the same few prototypes).
            Defaults to 0.02.

    Returns:
        str | None: 'uniform', 'one-dimension' or None (healthy).
    """
    if entropy > max_entropy_ratio * log_k:
        return 'uniform'
    if batch_entropy - entropy < min_info_ratio * log_k:
        return 'uniform' if batch_entropy > 0.9 * log_k else 'one-dimension'
    return None


@HOOKS.register_module()
class DINOCollapseMonitorHook(Hook):
    """Watch the DINO model's logged signals of every iteration.

    The signals stay on the device during training; the hook reads those of all iterations
    since the last read at once every ``interval`` iterations (by default the logging interval),
    at the end of every epoch and at the end of training, and checks them iteration by
    iteration, so a stop comes at most ``interval - 1`` iterations after the iteration it names.

    Raises ``RuntimeError`` (naming the iteration, the collapse, the signals and what to try)
    when

    * ``loss`` (or any teacher signal / ``kl``) is NaN or inf, at once;
    * the teacher collapsed (:func:`collapse_kind`) for ``patience`` consecutive iterations
      (iterations before ``begin_iter`` do not count). The signals are the model's
      ``teacher_entropy`` (mean per-image entropy), ``teacher_batch_entropy`` (entropy of the
      batch-mean distribution) and ``prototypes_used`` (distinct argmax prototypes). A sharp
      teacher that spreads the images over many prototypes is healthy, however low its
      per-image entropy.

    Args:
        patience (int): consecutive collapsed iterations before stopping. Defaults to 200.
        max_entropy_ratio (float): uniform collapse above this fraction of ``log(K)`` of
            per-image entropy. Defaults to 0.995.
        min_info_ratio (float): collapse when the batch-mean entropy exceeds the per-image
            entropy by less than this fraction of ``log(K)``. Defaults to 0.02.
        begin_iter (int): first (0-based) iteration that is checked for collapse.
            Defaults to 0.
        out_dim (int, optional): ``K``; by default read from ``model.head.out_channels``.
        interval (int, optional): iterations between reads of the signals; by default the
            ``LoggerHook``'s interval (1 without one). 1 reads (and waits for the device)
            every iteration.
    """
    priority = 'NORMAL'
    SIGNALS = ('teacher_entropy', 'teacher_batch_entropy')
    KEPT = ('loss', *SIGNALS, 'kl', 'prototypes_used')

    def __init__(self, patience: int = 200, max_entropy_ratio: float = 0.995,
                 min_info_ratio: float = 0.02, begin_iter: int = 0,
                 out_dim: Optional[int] = None, interval: Optional[int] = None):
        if patience < 1:
            raise ValueError(f'DINOCollapseMonitorHook: patience={patience} must be >= 1')
        if not 0 < max_entropy_ratio <= 1 or not 0 <= min_info_ratio < 1:
            raise ValueError('DINOCollapseMonitorHook: need 0 < max_entropy_ratio '
                             f'({max_entropy_ratio}) <= 1 and 0 <= min_info_ratio '
                             f'({min_info_ratio}) < 1')
        self.patience, self.begin_iter, self.out_dim = patience, begin_iter, out_dim
        self.max_ratio, self.min_info_ratio = max_entropy_ratio, min_info_ratio
        if interval is not None and interval < 1:
            raise ValueError(f'DINOCollapseMonitorHook: interval={interval} must be >= 1')
        self.interval, self._every = interval, 1
        self._streak, self._kind, self._since = 0, None, None
        self._pending: list = []
        self._model = None

    def before_train(self, runner) -> None:
        if self.out_dim is None:
            head = getattr(get_ori_model(runner.model), 'head', None)
            if getattr(head, 'out_channels', None) is None:
                raise TypeError('DINOCollapseMonitorHook: cannot read out_dim from '
                                'model.head.out_channels; pass out_dim=')
            self.out_dim = head.out_channels
        self._streak, self._kind, self._since = 0, None, None
        self._every, self._pending = logging_interval(runner, self.interval), []
        self._model = get_ori_model(runner.model)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if outputs:
            kept = {k: outputs[k] for k in self.KEPT if k in outputs}
            self._pending.append((runner.iter, runner.epoch, kept))
        if read_due(self, runner, batch_idx, self._every):
            self.check_pending()

    def after_train_epoch(self, runner) -> None:
        self.check_pending()

    def after_train(self, runner) -> None:
        self.check_pending()

    def check_pending(self) -> None:
        """Read the kept signals (one host read) and check them in iteration order."""
        pending, self._pending = self._pending, []
        flat = to_host(v for _, _, kept in pending for v in kept.values())
        for iteration, epoch, kept in pending:
            values = dict(zip(kept, flat[:len(kept)]))
            flat = flat[len(kept):]
            self._check_iteration(iteration, epoch, values)

    def _check_iteration(self, iteration: int, epoch: int, values: dict) -> None:
        it = iteration + 1
        for key in ('loss', *self.SIGNALS, 'kl'):
            if key in values and not math.isfinite(values[key]):
                raise RuntimeError(f'DINO training stopped at iteration {it} (epoch '
                                   f'{epoch + 1}): {key} is {values[key]}. ' + NAN_HINT)
        if any(k not in values for k in self.SIGNALS) or iteration < self.begin_iter:
            return
        self._check_collapse(epoch, it, values)

    def _check_collapse(self, epoch: int, it: int, signals: dict) -> None:
        log_k = math.log(self.out_dim)
        kind = collapse_kind(signals['teacher_entropy'], signals['teacher_batch_entropy'],
                             log_k, self.max_ratio, self.min_info_ratio)
        if kind is None or kind != self._kind:
            self._streak, self._kind, self._since = 0, kind, it
        if kind is None:
            return
        self._streak += 1
        if self._streak >= self.patience:
            h, hb = signals['teacher_entropy'], signals['teacher_batch_entropy']
            used = signals.get('prototypes_used', float('nan'))
            raise RuntimeError(
                f'DINO training stopped at iteration {it} (epoch {epoch + 1}): '
                f'{kind} collapse of the teacher for {self._streak} consecutive iterations '
                f'since iteration {self._since}. Signals (log(K) = {log_k:.4f} for K = '
                f'{self.out_dim}): teacher_entropy = {h:.4f} nats per image '
                f'({h / log_k:.3f} x log(K); uniform above {self.max_ratio}), '
                f'teacher_batch_entropy = {hb:.4f} nats (it exceeds the per-image entropy by '
                f'{hb - h:.4f} nats = {(hb - h) / log_k:.3f} x log(K): the information the '
                f'teacher output carries about the image; collapsed below '
                f'{self.min_info_ratio}), prototypes_used = {used:.0f}, '
                f'kl(teacher||student) = {signals.get("kl", float("nan")):.4g}. '
                + collapse_hint(kind, self._model))
