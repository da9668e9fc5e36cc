"""Re-seed the random generators at the start of every training epoch, so ``--resume`` is exact.

mmengine seeds ``random``, ``numpy`` and ``torch`` once, when the runner is built, and does not
save their states in checkpoints. A run resumed at epoch ``e`` therefore draws other random
augmentations (flips, crops, blur) than the uninterrupted run did in epoch ``e``. With this hook
every epoch starts from ``seed + epoch``, in both runs, and a resumed run repeats the
uninterrupted one exactly (on CPU, ``num_workers=0``; data loader workers are seeded by mmengine
from the runner seed and the worker id).
"""
import random
from typing import Optional

import numpy as np
import torch
from mmengine.hooks import Hook
from mmpretrain.registry import HOOKS


@HOOKS.register_module()
class EpochSeedHook(Hook):
    """Seed ``random``, ``numpy`` and ``torch`` with ``seed + epoch`` before each train epoch.

    Args:
        seed (int, optional): base seed. Defaults to None: the runner's seed
            (``randomness.seed``), or 0 when the runner has none.
    """

    priority = 'VERY_HIGH'

    def __init__(self, seed: Optional[int] = None):
        self.seed = seed

    def before_train_epoch(self, runner) -> None:
        base = self.seed if self.seed is not None else (getattr(runner, 'seed', None) or 0)
        seed = (int(base) + int(runner.epoch)) % 2**32
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
