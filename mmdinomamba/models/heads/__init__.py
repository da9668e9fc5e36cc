"""models/heads."""
from .dino_head import DINOHead, WeightNormLinear  # noqa: F401
from .dino_loss import DINOLoss, koleo_loss, sinkhorn_knopp, teacher_collapse_signals  # noqa: F401
