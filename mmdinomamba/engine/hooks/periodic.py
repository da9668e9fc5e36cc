"""The schedule shared by the evaluation hooks: every ``interval`` epochs (or iterations) and
after the last one."""
from mmengine.hooks import Hook


class PeriodicEvalHook(Hook):
    """Calls :meth:`evaluate` every ``interval`` epochs (iterations if not ``by_epoch``) and at
    the end of training; subclasses implement ``evaluate(runner, step)``.

    Args:
        interval (int): evaluate every ``interval`` epochs / iterations (>= 1).
        by_epoch (bool): epoch- or iteration-based interval.
    """
    priority = 'LOW'

    def __init__(self, interval: int = 1, by_epoch: bool = True):
        if interval < 1:
            raise ValueError(f'{type(self).__name__}: interval must be >= 1, got {interval}')
        self.interval, self.by_epoch = interval, by_epoch
        self.last_metrics = None

    def after_train_epoch(self, runner) -> None:
        if self.by_epoch and (self.every_n_epochs(runner, self.interval)
                              or self.is_last_train_epoch(runner)):
            self.evaluate(runner, step=runner.epoch + 1)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if not self.by_epoch and (self.every_n_train_iters(runner, self.interval)
                                  or self.is_last_train_iter(runner)):
            self.evaluate(runner, step=runner.iter + 1)

    def evaluate(self, runner, step: int) -> dict:
        raise NotImplementedError

    def publish(self, runner, metrics: dict, step: int, name: str, detail: str) -> None:
        """Send ``metrics`` to the message hub and every visualizer backend, keep them as
        ``last_metrics`` and log ``<name> of the teacher backbone at <epoch|iter> <step>`` and
        ``detail``."""
        for key, value in metrics.items():
            runner.message_hub.update_scalar(key, value)
        runner.visualizer.add_scalars(metrics, step=step)
        unit = 'epoch' if self.by_epoch else 'iter'
        runner.logger.info(f'{name} of the teacher backbone at {unit} {step}{detail}')
        self.last_metrics = metrics
