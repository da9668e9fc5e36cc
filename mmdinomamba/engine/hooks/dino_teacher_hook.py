"""Drive DINO's schedules and teacher EMA from the runner's iteration counter."""
from mmengine.hooks import Hook
from mmpretrain.registry import HOOKS
from mmpretrain.utils import get_ori_model

__all__ = ['DINOTeacherHook']

#: the model inside a DDP / FSDP wrapper (mmpretrain's helper; the name the hooks import)


@HOOKS.register_module()
class DINOTeacherHook(Hook):
    """Before every training iteration, ``model.set_progress(iter, max_iters, epoch_len)``;
    after it (after the optimizer step, before checkpointing), ``model.update_teacher()``.

    The model computes the teacher temperature, the EMA momentum and the last-layer freeze from
    that progress alone (see :class:`~mmdinomamba.models.selfsup.DINO`), so nothing here holds
    state, and a resumed run continues exactly where the checkpoint left off. ``epoch_len`` is
    ``len(runner.train_dataloader)``. Works with and without a DDP wrapper.

    Args:
        priority (str | int): ``'ABOVE_NORMAL'`` runs the teacher update before the collapse
            monitor, the logger and the checkpoint hook. Defaults to 'ABOVE_NORMAL'.
    """

    def __init__(self, priority='ABOVE_NORMAL'):
        self.priority = priority

    @staticmethod
    def _dino(runner):
        model = get_ori_model(runner.model)
        for name in ('set_progress', 'update_teacher'):
            if not callable(getattr(model, name, None)):
                raise TypeError(f'DINOTeacherHook: the model {type(model).__name__} has no '
                                f'{name}() method; this hook is for the DINO model only')
        return model

    def before_train(self, runner) -> None:
        self._dino(runner)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        self._dino(runner).set_progress(runner.iter, runner.max_iters,
                                        len(runner.train_dataloader))

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._dino(runner).update_teacher()
