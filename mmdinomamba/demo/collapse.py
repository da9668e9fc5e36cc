"""Collapse as a result of the demo, not a crash.

In the pretraining config that the demo writes, :class:`DINOCollapseMonitorHook` is replaced by
:class:`DemoCollapseMonitorHook`: the same monitor (same arguments, same decision, same error),
which before re-raising the monitor's error saves the model (teacher included) as
``collapse_iter_<N>.pth`` in the work dir and writes ``collapse.json`` (kind, iteration, signals,
what to change, the checkpoint) into the run's log folder. ``tools/train.py`` still stops with
the monitor's error; the demo then reads the record (:func:`read_collapse`), evaluates that
teacher, writes its report with a ``collapse`` entry and exits with :data:`EXIT_COLLAPSE`.
"""
import glob
import json
import os
import os.path as osp
from typing import Optional

from mmpretrain.registry import HOOKS

from mmdinomamba.engine.hooks.dino_collapse_hook import (DINOCollapseMonitorHook,
                                                         collapse_hint)

__all__ = ['DemoCollapseMonitorHook', 'read_collapse', 'EXIT_COLLAPSE', 'RECORD']

#: exit status of ``tools/demo.py`` when a pretraining collapsed (report and summary written)
EXIT_COLLAPSE = 3
#: the record's file name, in the run's timestamped log folder
RECORD = 'collapse.json'
_SIGNALS = ('teacher_entropy', 'teacher_batch_entropy', 'prototypes_used', 'kl', 'loss')


@HOOKS.register_module()
class DemoCollapseMonitorHook(DINOCollapseMonitorHook):
    """:class:`DINOCollapseMonitorHook` that leaves the collapsed teacher and a record behind.

    Only a collapse is recorded (a non-finite loss stays a plain error: its weights are not
    worth evaluating). Arguments: those of :class:`DINOCollapseMonitorHook`.
    """

    def before_train(self, runner) -> None:
        super().before_train(runner)
        self._runner = runner

    def _check_collapse(self, epoch: int, it: int, signals: dict) -> None:
        # the monitor checks the kept signals at its reads (every `interval` iterations, at the
        # end of an epoch and of training), so the collapse is recorded wherever it is found
        try:
            super()._check_collapse(epoch, it, signals)
        except RuntimeError as err:
            self._record(self._runner, it, epoch, signals, err)
            raise

    def _record(self, runner, it: int, epoch: int, signals: dict, err: Exception) -> None:
        # the weights are those of the iteration at which the monitor read the signals (at most
        # `interval - 1` iterations after the collapse was complete)
        stopped = runner.iter + 1
        name = f'collapse_iter_{stopped}.pth'
        runner.save_checkpoint(runner.work_dir, name, save_optimizer=False,
                               save_param_scheduler=False, by_epoch=False)
        record = dict(
            kind=self._kind, iteration=it, epoch=epoch + 1, since_iteration=self._since,
            consecutive_iterations=self._streak, stopped_at_iteration=stopped,
            out_dim=self.out_dim,
            signals={k: float(signals[k]) for k in _SIGNALS if k in signals},
            what_to_change=collapse_hint(self._kind, self._model),
            message=str(err), checkpoint=osp.join(runner.work_dir, name))
        path = osp.join(runner.log_dir, RECORD)
        tmp = path + '.tmp'
        with open(tmp, 'w') as f:
            json.dump(record, f, indent=1)
        os.replace(tmp, path)


def read_collapse(work_dir: str, since: float = 0.) -> Optional[dict]:
    """The collapse record of the newest run in ``work_dir`` written after ``since`` (a
    ``time.time()``), or None. A record whose checkpoint is missing is an error naming both."""
    found = [p for p in glob.glob(osp.join(work_dir, '*', RECORD)) if osp.getmtime(p) >= since]
    if not found:
        return None
    path = max(found, key=osp.getmtime)
    with open(path) as f:
        record = json.load(f)
    if not osp.isfile(record.get('checkpoint', '')):
        raise FileNotFoundError(f'{path} names the checkpoint {record.get("checkpoint")!r}, '
                                'which does not exist')
    record['record'] = path
    return record
