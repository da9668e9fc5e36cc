"""Random streams that are functions of the epoch and the iteration, so ``--resume`` is exact.

mmengine seeds ``random``, ``numpy`` and ``torch`` once, when the runner is built, does not save
their states in checkpoints, seeds non-persistent data loader workers identically in every epoch
(each epoch then repeats the previous one's augmentations, only in another order), and replays a
whole epoch when resuming from an iteration checkpoint. With :class:`EpochSeedHook`:

- the main process is seeded with ``seed + epoch`` at the start of every epoch and with a seed
  mixed from ``(seed, iteration)`` after every iteration (what the next batch and the model's own
  randomness draw from);
- data loader workers get seeds mixed from ``(seed, epoch, rank, worker)`` (epoch 0 keeps
  mmengine's seeds), so every epoch draws new augmentations;
- a run resumed from an iteration checkpoint in the middle of an epoch skips the batches of that
  epoch already trained (same sampler order) and puts every random stream where the
  uninterrupted run had it: the main process through the iteration seed, workers by re-drawing
  (and discarding) the samples that they had already processed.

A resumed run therefore repeats the uninterrupted one exactly, from epoch and iteration
checkpoints, with ``num_workers=0`` or non-persistent workers (persistent workers carry their
streams across epochs, which a checkpoint cannot hold: a warning says so).
"""
import random
from typing import List, Optional

import numpy as np
import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.runner import EpochBasedTrainLoop
from mmpretrain.registry import HOOKS
from torch.utils.data import BatchSampler, get_worker_info

_ITER, _WORKER = 1, 2  # domains of the mixed seeds


def mixed_seed(*values: int) -> int:
    """A 32-bit seed mixed from ``values`` (``numpy.random.SeedSequence``)."""
    return int(np.random.SeedSequence([int(v) % 2**32 for v in values]).generate_state(1)[0])


def seed_all(seed: int) -> None:
    """Seed ``random``, ``numpy`` and ``torch`` (every device)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class _EpochWorkerInit:
    """``worker_init_fn`` for one epoch: the loader's own one, then (after epoch 0) seeds mixed
    from ``(seed, epoch, rank, worker)``, then a replay of the samples this worker had drawn
    before the resume point.

    Batches are dealt to workers in turn, so after skipping ``skipped`` batches the new worker
    ``w`` takes the place of the uninterrupted run's worker ``(w + skipped) % num_workers``.
    """

    def __init__(self, base_fn, seed: int, epoch: int, rank: int, num_workers: int,
                 skipped_batches: List[List[int]]):
        self.base_fn, self.seed, self.epoch, self.rank = base_fn, seed, epoch, rank
        self.num_workers, self.skipped_batches = num_workers, skipped_batches

    def __call__(self, worker_id: int) -> None:
        wid = (worker_id + len(self.skipped_batches)) % self.num_workers
        if self.base_fn is not None:
            self.base_fn(wid)
        if self.epoch > 0:
            seed_all(mixed_seed(_WORKER, self.seed, self.epoch, self.rank, wid))
        dataset = get_worker_info().dataset
        for batch in self.skipped_batches[wid::self.num_workers]:
            for index in batch:
                dataset[index]  # same draws as the uninterrupted run, result discarded


class _SkipFirst:
    """A sampler that leaves out the first ``num`` indices of ``sampler`` and calls
    ``on_start()`` right before yielding the first remaining one."""

    def __init__(self, sampler, num: int, on_start):
        self.sampler, self.num, self.on_start = sampler, num, on_start

    def __iter__(self):
        it = iter(self.sampler)
        for _ in range(self.num):
            next(it)
        self.on_start()
        yield from it

    def __len__(self) -> int:
        return len(self.sampler)


@HOOKS.register_module()
class EpochSeedHook(Hook):
    """Seed every epoch and iteration, give workers fresh seeds every epoch, and resume exactly
    from iteration checkpoints (see the module docstring).

    Args:
        seed (int, optional): base seed. Defaults to None: the runner's seed
            (``randomness.seed``), or 0 when the runner has none.
    """

    priority = 'VERY_HIGH'

    def __init__(self, seed: Optional[int] = None):
        self.seed = seed
        self._saved_epoch_len = None  # batches per epoch of the checkpoint resumed from
        self._restore = None  # (batch sampler, its sampler) while skipping

    def _base(self, runner) -> int:
        return int(self.seed if self.seed is not None else (getattr(runner, 'seed', None) or 0))

    def before_train(self, runner) -> None:
        loader = runner.train_dataloader
        if loader.num_workers > 0 and loader.persistent_workers:
            runner.logger.warning(
                'EpochSeedHook: train_dataloader.persistent_workers=True keeps the workers\' '
                'random streams across epochs, which checkpoints do not hold: --resume will not '
                'repeat the uninterrupted run exactly. Set persistent_workers=False for that.')

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        checkpoint.setdefault('meta', {})['epoch_len'] = len(runner.train_dataloader)

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        self._saved_epoch_len = checkpoint.get('meta', {}).get('epoch_len')

    def _batches_done(self, runner) -> int:
        """Batches of the current epoch already trained (> 0 only when resumed mid-epoch)."""
        epoch_len = len(runner.train_dataloader)
        done = runner.iter - runner.epoch * epoch_len
        saved, self._saved_epoch_len = self._saved_epoch_len, None
        if runner.iter == 0 or not isinstance(runner.train_loop, EpochBasedTrainLoop):
            return 0  # a new run (load_from only loads weights), or an iteration-based loop
        if (saved is not None and saved != epoch_len) or not 0 <= done <= epoch_len:
            raise RuntimeError(
                f'EpochSeedHook: cannot resume at iteration {runner.iter} of epoch '
                f'{runner.epoch + 1}: the checkpoint was made with '
                f'{saved if saved is not None else "another number of"} batches per epoch, the '
                f'train_dataloader now has {epoch_len}. Resume with the same data set, '
                'batch size and number of processes as the checkpoint.')
        return done

    def before_train_epoch(self, runner) -> None:
        base = self._base(runner)
        seed_all((base + int(runner.epoch)) % 2**32)
        loader = runner.train_dataloader
        done = self._batches_done(runner)
        skipped = self._skipped_batches(loader, runner.epoch, done) if done else []
        if loader.num_workers > 0:
            init = loader.worker_init_fn
            if isinstance(init, _EpochWorkerInit):  # set by this hook for the previous epoch
                init = init.base_fn
            loader.worker_init_fn = _EpochWorkerInit(init, base, runner.epoch, get_rank(),
                                                     loader.num_workers, skipped)
        if done:
            runner.logger.info(
                f'EpochSeedHook: resuming in epoch {runner.epoch + 1} after {done} of '
                f'{len(loader)} batches: skipping them (same order), continuing at iteration '
                f'{runner.iter}')
            batch_sampler = loader.batch_sampler
            sampler = batch_sampler.sampler
            seed = mixed_seed(_ITER, base, runner.iter)  # as after_train_iter of the last one
            batch_sampler.sampler = _SkipFirst(sampler, done * batch_sampler.batch_size,
                                               lambda: seed_all(seed))
            self._restore = (batch_sampler, sampler)

    def _skipped_batches(self, loader, epoch: int, done: int) -> List[List[int]]:
        """The index lists of the first ``done`` batches of ``epoch`` (as the loader draws
        them)."""
        batch_sampler = loader.batch_sampler
        if type(batch_sampler) is not BatchSampler:
            raise RuntimeError(
                'EpochSeedHook: resuming in the middle of an epoch needs a plain batch sampler '
                f'(got {type(batch_sampler).__name__}); resume from an epoch checkpoint instead')
        sampler = batch_sampler.sampler
        if hasattr(sampler, 'set_epoch'):
            sampler.set_epoch(epoch)  # as DistSamplerSeedHook does right after this hook
        indices = iter(sampler)
        size = batch_sampler.batch_size
        return [[next(indices) for _ in range(size)] for _ in range(done)]

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        seed_all(mixed_seed(_ITER, self._base(runner), runner.iter + 1))

    def after_train_epoch(self, runner) -> None:
        if self._restore is not None:
            batch_sampler, sampler = self._restore
            batch_sampler.sampler = sampler
            self._restore = None
