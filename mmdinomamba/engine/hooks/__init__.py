"""engine/hooks."""
from .binary_auc_hook import BinaryAUCHook  # noqa: F401
