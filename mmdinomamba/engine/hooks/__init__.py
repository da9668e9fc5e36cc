"""engine/hooks."""
from .binary_auc_hook import BinaryAUCHook  # noqa: F401
from .epoch_seed_hook import EpochSeedHook  # noqa: F401
