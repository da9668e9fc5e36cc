"""engine/hooks."""
from .binary_auc_hook import BinaryAUCHook  # noqa: F401
from .knn_hook import KNNEvalHook  # noqa: F401
from .checkpoint_hook import AtomicCheckpointHook  # noqa: F401
from .epoch_seed_hook import EpochSeedHook  # noqa: F401
from .dino_collapse_hook import DINOCollapseMonitorHook  # noqa: F401
from .dino_teacher_hook import DINOTeacherHook  # noqa: F401
from .dino_runtime_info_hook import DINORuntimeInfoHook  # noqa: F401
