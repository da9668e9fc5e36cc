"""mmengine's ``RuntimeInfoHook`` that moves the logged device scalars to the message hub at
the logging interval instead of every iteration."""
from typing import Optional

from mmengine.hooks import RuntimeInfoHook
from mmengine.utils import apply_to
from mmpretrain.registry import HOOKS

from .device_scalars import logging_interval, read_due, to_host

__all__ = ['DINORuntimeInfoHook']


@HOOKS.register_module()
class DINORuntimeInfoHook(RuntimeInfoHook):
    """:class:`mmengine.hooks.RuntimeInfoHook` without a host read in the training iteration.

    mmengine's hook calls ``message_hub.update_scalar(key, tensor)`` for every value the model
    returns, i.e. one ``.item()`` (a wait for the device) per value and iteration. This hook
    keeps the values of every iteration (and the clipped gradient norm the DINO optimizer
    wrappers keep, :meth:`~mmdinomamba.engine.dino_optim.DINOOptimWrapper.pop_pending_scalars`)
    and writes them to the message hub, in order and unchanged, right before the
    ``LoggerHook`` reads them (every ``interval`` iterations of an epoch and at its end), before
    a checkpoint is written, and at the end of an epoch or of training. What the logger, the
    JSON log and TensorBoard show is the same as with mmengine's hook.

    Set it in a config with ``default_hooks = dict(runtime_info=dict(type=
    'DINORuntimeInfoHook'))`` (the DINO runtime does).

    Args:
        interval (int, optional): iterations between reads; defaults to the ``LoggerHook``'s
            interval.
    """

    def __init__(self, interval: Optional[int] = None):
        super().__init__()
        self.interval = interval
        self._every = 1
        self._pending: list = []

    def before_train(self, runner) -> None:
        super().before_train(runner)
        self._every = logging_interval(runner, self.interval)
        self._pending = []
        if hasattr(runner.optim_wrapper, 'defer_scalars'):  # the DINO wrappers: keep the norm
            runner.optim_wrapper.defer_scalars = True

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs: Optional[dict] = None) -> None:
        pop = getattr(runner.optim_wrapper, 'pop_pending_scalars', None)
        if callable(pop):
            self._pending.extend(pop())
        if outputs is not None:
            self._pending.extend((f'train/{key}', value) for key, value in outputs.items())
        if read_due(self, runner, batch_idx, self._every):
            self.flush(runner)

    def flush(self, runner) -> None:
        """Write the kept values to the message hub (one host read for all of them)."""
        pending, self._pending = self._pending, []
        for (key, _), value in zip(pending, to_host(v for _, v in pending)):
            runner.message_hub.update_scalar(key, value)

    def after_train_epoch(self, runner) -> None:
        self.flush(runner)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        if self._pending:  # the checkpoint took the message hub before the hooks ran
            self.flush(runner)
            checkpoint['message_hub'] = apply_to(runner.message_hub.state_dict(),
                                                 lambda x: hasattr(x, 'cpu'), lambda x: x.cpu())

    def before_val(self, runner) -> None:
        self.flush(runner)
        super().before_val(runner)

    def after_train(self, runner) -> None:
        self.flush(runner)
        super().after_train(runner)
