"""mmengine's ``CheckpointHook`` with saves that a kill cannot break.

mmengine removes the oldest kept checkpoint (``max_keep_ckpts``) *before* writing the new one and
writes the new one in place: a run killed while saving with ``max_keep_ckpts=1`` has no complete
checkpoint left, and ``last_checkpoint`` names a deleted or half-written file.
:class:`AtomicCheckpointHook` writes every checkpoint to a hidden scratch file, renames it into
place (``os.replace``), then updates ``last_checkpoint`` (also atomically), and only then removes
the checkpoints that fall out of ``max_keep_ckpts`` (or a previous best one). Scratch files of
killed runs are removed when the next run starts. Resuming an epoch-based run from an iteration
checkpoint in the middle of an epoch is refused unless :class:`EpochSeedHook` (which makes it
exact) is registered.
"""
import logging
import os
import os.path as osp
from contextlib import contextmanager

from mmengine.dist import is_main_process
from mmengine.fileio.backends import LocalBackend
from mmengine.hooks import CheckpointHook
from mmengine.logging import print_log
from mmengine.registry import HOOKS
from mmengine.runner import EpochBasedTrainLoop

from ...utils.files import (explain_write_errors, fsync_file, scratch_path, stale_scratch_target,
                            write_text_atomic)
from ...utils.quiet import without_log_messages
from .epoch_seed_hook import EpochSeedHook

__all__ = ['AtomicCheckpointHook']

#: mmengine builds a deprecated FileClient when the hook starts and at every save, even without
#: ``file_client_args``, and warns about it each time
FILE_CLIENT_NOTICES = ('"FileClient" will be deprecated', '"HardDiskBackend" is the alias')


class _DeferredRemovals:
    """A file backend whose ``remove`` / ``rmtree`` are recorded instead of done."""

    def __init__(self, backend):
        self._backend, self.pending = backend, []

    def remove(self, path):
        self.pending.append(('remove', path))

    def rmtree(self, path):
        self.pending.append(('rmtree', path))

    def __getattr__(self, name):
        return getattr(self._backend, name)


class _AtomicSaveRunner:
    """The runner, with ``save_checkpoint`` writing through a scratch file (for the parent
    class's best-checkpoint code)."""

    def __init__(self, runner, hook):
        self._runner, self._hook = runner, hook

    def save_checkpoint(self, out_dir, filename, *args, **kwargs):
        self._hook._save_atomically(self._runner, out_dir, filename, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._runner, name)


@HOOKS.register_module()
class AtomicCheckpointHook(CheckpointHook):
    """``CheckpointHook`` (same arguments) whose checkpoints survive a kill during saving.

    At every moment the newest complete checkpoint exists and ``last_checkpoint`` (in the work
    dir) names a complete file: the new checkpoint is written to
    ``.<name>.partial-<host>-<pid>-<hex>`` in the checkpoint folder, flushed, renamed into place,
    ``last_checkpoint`` is replaced, and only then are older checkpoints beyond
    ``max_keep_ckpts`` (and a superseded best checkpoint) removed. Storage other than a local
    folder (``backend_args`` / ``out_dir`` on a remote file system) falls back to mmengine's
    behaviour, with a warning.
    """

    def before_train(self, runner) -> None:
        with without_log_messages(*self._file_client_notices()):
            super().before_train(runner)
        if self._local() and is_main_process():
            self._remove_stale_scratch(runner)
        self._check_resume_point(runner)

    @staticmethod
    def _check_resume_point(runner) -> None:
        """Refuse to resume an epoch-based run in the middle of an epoch unless
        :class:`EpochSeedHook` is there to skip the batches already trained (mmengine would
        train the whole epoch again and run past ``max_iters``)."""
        if not isinstance(runner.train_loop, EpochBasedTrainLoop) or runner.iter == 0:
            return
        epoch_len = len(runner.train_dataloader)
        done = runner.iter - runner.epoch * epoch_len
        if done == 0 or any(isinstance(h, EpochSeedHook) for h in runner.hooks):
            return
        raise RuntimeError(
            f'Cannot resume at iteration {runner.iter}: with {epoch_len} batches per epoch, '
            f'epoch {runner.epoch + 1} starts at iteration {runner.epoch * epoch_len}. This is '
            'an iteration checkpoint from the middle of an epoch (or the data set / batch size '
            'changed since it was saved). Add custom_hooks=[dict(type=\'EpochSeedHook\')] to '
            'skip the batches already trained and resume exactly, or resume from an epoch '
            'checkpoint.')

    def _file_client_notices(self) -> tuple:
        """The notices to drop: none when the user asked for a FileClient."""
        return () if self.file_client_args else FILE_CLIENT_NOTICES

    def _local(self) -> bool:
        return isinstance(self.file_backend, LocalBackend) and self.file_client_args is None

    def _remove_stale_scratch(self, runner) -> None:
        if not osp.isdir(self.out_dir):
            return
        for entry in os.listdir(self.out_dir):
            if stale_scratch_target(entry) is not None:
                path = osp.join(self.out_dir, entry)
                runner.logger.warning(f'Removing {path}: a checkpoint left half-written by an '
                                      'interrupted run')
                os.remove(path)

    def _save_atomically(self, runner, out_dir, filename, *args, **kwargs) -> None:
        """``runner.save_checkpoint`` into a scratch file, then ``os.replace`` into place.
        Out of space or permission: a ``WorkDirWriteError`` naming the checkpoint (the
        previous one stays)."""
        final = osp.join(out_dir, filename)
        tmp = scratch_path(final)
        previous = getattr(self, '_previous', None)
        kept = f'the previous checkpoint {previous} is kept' if previous else ''
        try:
            with explain_write_errors(final, 'the checkpoint', kept), \
                    without_log_messages(*self._file_client_notices()):
                runner.save_checkpoint(out_dir, osp.basename(tmp), *args, **kwargs)
                if is_main_process():  # Runner.save_checkpoint writes on the main process only
                    fsync_file(tmp)
                    os.replace(tmp, final)
        except BaseException:
            if osp.exists(tmp):
                os.remove(tmp)
            raise

    @contextmanager
    def _removals_after(self):
        """Defer the parent class's checkpoint removals until the block has saved its file."""
        backend = self.file_backend
        deferred = self.file_backend = _DeferredRemovals(backend)
        try:
            yield
        finally:
            self.file_backend = backend
        for op, path in deferred.pending:
            if op == 'remove' and path != self.last_ckpt:
                backend.remove(path)
            elif op == 'rmtree':
                backend.rmtree(path)

    def _save_checkpoint_with_step(self, runner, step, meta):
        if isinstance(runner, _AtomicSaveRunner):  # called from _save_best_checkpoint
            runner = runner._runner
        if not self._local():
            if not getattr(self, '_warned_remote', False):
                print_log('AtomicCheckpointHook: checkpoints on a non-local storage are saved '
                          "by mmengine's CheckpointHook (not atomically)", logger='current',
                          level=logging.WARNING)
                self._warned_remote = True
            return super()._save_checkpoint_with_step(runner, step, meta)
        with self._removals_after():
            if self.max_keep_ckpts > 0 and not (self.keep_ckpt_ids
                                                and self.keep_ckpt_ids[-1] == step):
                if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
                    old = self.keep_ckpt_ids.popleft()
                    if is_main_process():
                        path = osp.join(self.out_dir, self.filename_tmpl.format(old))
                        if osp.isfile(path):
                            self.file_backend.remove(path)
                        elif osp.isdir(path):
                            self.file_backend.rmtree(path)
                self.keep_ckpt_ids.append(step)
                runner.message_hub.update_info('keep_ckpt_ids', list(self.keep_ckpt_ids))
            filename = self.filename_tmpl.format(step)
            self._previous = getattr(self, 'last_ckpt', None)
            self.last_ckpt = osp.join(self.out_dir, filename)
            runner.message_hub.update_info('last_ckpt', self.last_ckpt)
            self._save_atomically(
                runner, self.out_dir, filename, save_optimizer=self.save_optimizer,
                save_param_scheduler=self.save_param_scheduler, meta=meta,
                by_epoch=self.by_epoch, backend_args=self.backend_args, **self.args)
            if is_main_process():
                write_text_atomic(osp.join(runner.work_dir, 'last_checkpoint'), self.last_ckpt,
                                  'the last_checkpoint file')

    def _save_best_checkpoint(self, runner, metrics) -> None:
        if not self._local():
            return super()._save_best_checkpoint(runner, metrics)
        with self._removals_after():
            super()._save_best_checkpoint(_AtomicSaveRunner(runner, self), metrics)
