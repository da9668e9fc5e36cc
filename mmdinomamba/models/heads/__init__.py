"""models/heads."""
from .dino_head import DINOHead, WeightNormLinear  # noqa: F401
from .dino_loss import DINOLoss  # noqa: F401
